"""`pyshim setup`'s work: the site's runtime vendored into web/vendor (Pyodide, wheels, npm packages, and
what Python defines for the page: definitions.js), the models pyshim knows by short name (`catalog`),
downloads from the package registries, model files placed and verified.
May import: everything before it (pyshim.errors … pyshim.serve)."""
