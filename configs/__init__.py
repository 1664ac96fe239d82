"""Per-family model settings (models/*.toml) and real architectures' configs (architectures/*.json, for
`hsd profile --random-weights`), installed as the package hsd_cli.configs: pyproject.toml maps this directory there, so wheel and editable installs read the same files."""
