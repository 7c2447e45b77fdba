"""What the steps keep: entities and their ledger, critical facts, rolling summaries."""
