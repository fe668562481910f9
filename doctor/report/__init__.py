"""Report renderers: text for people, JSON per the contract (with its JSON Schema), JUnit XML for CI."""
