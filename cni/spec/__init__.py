"""The CNI contract: versions, errors, results and configs. Pure: imports nothing of the host."""
