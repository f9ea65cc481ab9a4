"""Copy a checkpoint's chat format into a bundle: its chat templates and generation defaults.

Takes the transformers tokenizer and model that export loaded (their `chat_template` came from
`tokenizer_config.json` — a string, or a list of named templates — or from
`chat_template.jinja` / `additional_chat_templates/*.jinja`, whichever the checkpoint had) and
writes each template to `chat_templates/NAME.jinja` in the bundle. Returns the `ChatFormat`
the manifest records, or None when the checkpoint has no chat template (a base model: the
bundle still generates, chat calls explain what is missing).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from edgespec.bundle import ChatFormat
from edgespec.errors import EdgespecError

TEMPLATE_DIR = "chat_templates"
# the sampling defaults a generation config may set that the runtime reads or shows
GENERATION_KEYS = (
    "do_sample",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "max_new_tokens",
)
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class ChatFormatError(EdgespecError, ValueError):
    """A chat template name cannot be written safely into the bundle."""


def save_chat_format(tokenizer: Any, hf_model: Any, out: Path) -> ChatFormat | None:
    """Write the templates under out/chat_templates/; the manifest's `chat` record, or None."""
    raw = getattr(tokenizer, "chat_template", None)
    if not raw:
        return None
    templates = {"default": raw} if isinstance(raw, str) else dict(raw)
    files: dict[str, str] = {}
    (out / TEMPLATE_DIR).mkdir(exist_ok=True)
    for name, text in templates.items():
        if not _NAME.match(name) or name in (".", ".."):
            raise ChatFormatError(
                f"chat template name {name!r} is not a plain file name (letters, digits, _ . -); "
                "rename it in the checkpoint's tokenizer_config.json"
            )
        rel = f"{TEMPLATE_DIR}/{name}.jinja"
        (out / rel).write_text(str(text), encoding="utf-8")
        files[name] = rel
    return ChatFormat(
        templates=files,
        special_tokens={k: str(v) for k, v in tokenizer.special_tokens_map.items()},
        generation=generation_defaults(hf_model),
    )


def generation_defaults(hf_model: Any) -> dict[str, Any]:
    """The sampling settings the model's generation config sets (unset ones are left out)."""
    gen = getattr(hf_model, "generation_config", None)
    out: dict[str, Any] = {}
    for key in GENERATION_KEYS:
        value = getattr(gen, key, None)
        if value is not None:
            out[key] = value
    return out
