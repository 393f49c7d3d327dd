"""Stream-table definitions: validated before anything is created, and the verbs that create, alter and drop them."""
