//! The sha256 of a byte string as lower-case hex: how payload digests, oversized item ids,
//! DLQ message ids and deduplication ids are written. The encoding is the `hex` crate's.

/// Returns the sha256 of `data` as 64 lower-case hex digits.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    ::hex::encode(Sha256::digest(data))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sha256_of_empty_input() {
        assert_eq!(
            super::sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
