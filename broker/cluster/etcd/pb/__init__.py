"""etcd v3 API stubs generated from etcd's protos (proto/generate_etcd.py); do not edit."""
