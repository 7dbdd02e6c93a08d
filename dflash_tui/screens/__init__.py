"""The console's screens: the main dashboard and its dialogs, one file each."""
