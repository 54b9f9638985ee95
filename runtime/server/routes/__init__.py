"""The HTTP routes, one module per API; each translates its wire format in and out."""
