"""Conversations: sessions that keep their KV cache, chat templates, the conversation store, and
tool calls read from reply text."""
