"""Per-family model settings (models/*.toml), installed as the package hsd_cli.configs: pyproject.toml maps this directory there, so wheel and editable installs read the same files."""
