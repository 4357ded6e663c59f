"""The simulator at paper scale: GPU operator cost models, model shapes and GPU specifications."""
