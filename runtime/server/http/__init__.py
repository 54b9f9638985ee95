"""HTTP plumbing under the routes: connection deadlines and bounds, Host/Origin/Content-Type
guards, disconnect watching, request limits at the wire, server-sent events.
"""
