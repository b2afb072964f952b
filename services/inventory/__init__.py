"""The node-inventory service: turns heartbeats into NodeRegistered, NodeLost, NodeRecovered."""
