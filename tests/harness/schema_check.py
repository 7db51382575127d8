#!/usr/bin/env python3
"""schema_check.py SCHEMA_DIR NAME FILE: FILE (one JSON document) is valid against
SCHEMA_DIR/NAME.schema.json, with every schema of SCHEMA_DIR available to $ref.
Exit 0 valid, 1 invalid (the reason on stderr), 77 when python3-jsonschema is missing."""
import json
import pathlib
import sys

try:
    import jsonschema
    from referencing import Registry, Resource
except ImportError:
    print("python3-jsonschema is not installed (tests/deps.sh installs it)", file=sys.stderr)
    sys.exit(77)

sdir, name, path = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
resources = []
for f in sorted(sdir.glob("*.schema.json")):
    doc = json.loads(f.read_text())
    resources.append((doc["$id"], Resource.from_contents(doc)))
registry = Registry().with_resources(resources)
schema = json.loads((sdir / (name + ".schema.json")).read_text())
jsonschema.Draft202012Validator.check_schema(schema)
try:
    jsonschema.Draft202012Validator(schema, registry=registry).validate(json.loads(pathlib.Path(path).read_text()))
except jsonschema.ValidationError as e:
    print("%s: not a valid %s document: %s at %s" % (path, name, e.message, list(e.absolute_path)), file=sys.stderr)
    sys.exit(1)
