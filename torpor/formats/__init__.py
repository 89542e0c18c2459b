"""The ground floor: typed records of everything torpor writes to disk or sends over a wire, with
their media types, annotation keys and file names, each defined once. Imports only torpor.errors
and the standard library."""
