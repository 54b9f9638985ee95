"""The scheduler, owner of every request from admission to finish, and the request record."""
