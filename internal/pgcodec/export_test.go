package pgcodec

// Registered reports whether m encodes text[] with this package's codec.
func Registered(codec any) bool {
	_, ok := codec.(textArrayCodec)
	return ok
}
