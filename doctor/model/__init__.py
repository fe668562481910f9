"""The model area: the target's and the drafter's files as the server will load them."""
