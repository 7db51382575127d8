#!/bin/sh
# The demo project's one feature.
greet() {
	printf 'hello, %s\n' "${1:-world}"
}
