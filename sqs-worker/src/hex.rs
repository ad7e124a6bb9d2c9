//! Lower-case hex encoding for digests (sha256 of payloads, error signatures).

/// Encodes bytes as lower-case hex.
pub fn encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// The sha256 of `data` as 64 hex digits.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    encode(&Sha256::digest(data))
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
