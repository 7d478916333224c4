package safetensors

// StBytes is stBytes, for the tests of package safetensors_test, which
// check the codec's errors against the reference model's weights loader.
var StBytes = stBytes
