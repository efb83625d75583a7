"""Gang scheduling: how a world's pods are placed all at once by its scheduler (Kueue, coscheduling,
Volcano)."""
