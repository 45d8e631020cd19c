// Package pytest runs the Python client's test suite (clients/python/tests:
// the client, the examples and the safetensors cross-check) against a real
// rbd serve, from go test. It has no code of its own.
//
// The suite needs Debian's /usr/bin/python3 with numpy
// (apt-get install -y python3-numpy); the install test also needs
// python3-venv and python3-setuptools. Without them the tests skip and say
// so.
package pytest
