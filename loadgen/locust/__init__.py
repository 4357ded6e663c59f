"""The Locust side: the locustfile, its users and schedule, and the web UI's LLM tab."""
