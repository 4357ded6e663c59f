"""stallfree-bench: the Hydra app, its config checks and one measured point after another."""
