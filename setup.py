"""The folders engine/, loadgen/, analysis/ and conf/ install as stallfree.engine, stallfree.loadgen,
stallfree.analysis and stallfree.conf: one distribution namespace, so that no generic top-level name
(``engine``, ``analysis``) lands in site-packages. Data folders (conf groups, traces, profiles) count as
namespace packages, so that their files ship with the package data globs of pyproject.toml."""
from setuptools import find_namespace_packages, setup

FOLDERS = ("engine", "loadgen", "analysis", "conf")
setup(packages=[f"stallfree.{p}" for p in find_namespace_packages(include=[f"{f}*" for f in FOLDERS],
                                                                            exclude=["*__pycache__*"])],
      package_dir={f"stallfree.{f}": f for f in FOLDERS})
