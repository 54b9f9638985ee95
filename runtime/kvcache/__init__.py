"""The KV cache: the paged pool of slots (pool.py), the radix tree that shares cached
prefixes between requests (radix_cache.py), and the leases that keep a program's prefix
(leases.py).
"""
