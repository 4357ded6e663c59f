"""What a run sends: arrivals, lengths, traces and text prompts, all from one seed."""
