"""The book machinery: building, running and sweeping notebooks, verdicts, the ledger, plots."""
