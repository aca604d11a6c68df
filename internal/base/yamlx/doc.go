// Package yamlx decodes YAML configuration strictly, with errors a person
// can act on: every error names the file, the line and the key path, and
// an unknown key gets a did-you-mean suggestion from the yaml tags at its
// level, so that
//
//	config.yaml:3: lease: "30" is not a duration (write it with a unit, e.g. 30s)
//	config.yaml:5: nats.urll: unknown key (did you mean "url"?)
//
// replace yaml.v3's "cannot unmarshal !!int `30` into time.Duration" and
// "field urll not found in type gateway.NATSConfig".
//
// yaml.v3 converts the values: decoding starts from what out holds and
// overwrites only the keys present (nested structs included), anchors and
// aliases work as in YAML, and a type with its own UnmarshalYAML decodes
// itself. yamlx adds, as yaml.v3's Decoder.KnownFields(true) does, that a
// key without a field is an error; yamlx checks keys itself because yaml.v3
// offers KnownFields only on a Decoder reading bytes, not on Node.Decode,
// which an UnmarshalYAML method and a node tree need. It also changes four
// rules, for files decoded over defaults:
//
//   - A merge key (<<) in a mapping for a struct merges nested structs key
//     by key, as decoding over defaults does: with <<: *base, an own
//     breaker: {factor: 1s} keeps the threshold base sets (YAML's merge
//     would drop base's whole breaker). Merges that expand too much are an
//     error, as yaml.v3 bounds aliases.
//   - A key set to null (or left empty) keeps the value out holds, for
//     every type; yaml.v3 would reset a slice, map or pointer to nil. Write
//     [] or {} to clear one.
//   - A bare 0 is a valid time.Duration; any other duration needs a unit.
//   - A float is not a whole number: 1.5 for an int is an error (yaml.v3
//     would truncate it).
//
// With the option [CommaLists], a []string may also be written as one
// comma-separated string.
//
// With the option [Check], the checks decoding cannot make (a value out of
// range) are reported with the decoding's errors, in one pass and in the
// same form: file, line, key path.
//
// A type's UnmarshalYAML may call [DecodeNode] and return its errors
// (alone or through errors.Join): when that type is decoded by yamlx, its
// errors get the file name and the key path from the root of the file.
package yamlx
