"""The Hydra configuration groups (package data: the YAML files beside this one)."""
