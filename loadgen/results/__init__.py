"""What a run leaves: request records, run directories, metrics and the summary block."""
