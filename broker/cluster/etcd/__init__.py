"""The broker's etcd client (client.py) and etcd's generated API stubs (pb/)."""
