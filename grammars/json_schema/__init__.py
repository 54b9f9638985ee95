"""JSON Schema -> regex: the converter (convert.py) and one module per keyword family."""
