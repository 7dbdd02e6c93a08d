"""The dashboard's panes, one file each; every pane redraws itself from RunState."""
