"""Dataset tooling: ImageNet's layout and preparation, and the file server's volume stanza."""
