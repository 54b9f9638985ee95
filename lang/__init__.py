"""User API: @program, gen, select, fork, roles (the lang issue builds it)."""
