"""Scripts of the local test bed (run as files; a package so they can share helpers)."""
