"""ChokaQ benchmark command (see bench/README.md)."""
