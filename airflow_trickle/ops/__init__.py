"""The operations verbs: repair, check, health, maintain, explain, status -- what a user runs on a warehouse."""
