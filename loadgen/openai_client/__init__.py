"""The load generator's HTTP side: streamed OpenAI requests sent open loop."""
