"""The folders engine/, loadgen/, analysis/ and conf/ install as stallfree.engine, stallfree.loadgen,
stallfree.analysis and stallfree.conf: one distribution namespace, so that no generic top-level name
(``engine``, ``analysis``) lands in site-packages. Everything else is in pyproject.toml."""
from setuptools import find_packages, setup

FOLDERS = ("engine", "loadgen", "analysis", "conf")
setup(packages=[f"stallfree.{p}" for p in find_packages(include=[f"{f}*" for f in FOLDERS])],
      package_dir={f"stallfree.{f}": f for f in FOLDERS})
