"""Placeholder main job until the backend lands: runs one NKI kernel on the bundled simulator."""
