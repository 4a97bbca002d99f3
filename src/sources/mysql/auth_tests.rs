//! MySQL 8's `caching_sha2_password`, as far as it can be checked without a MySQL 8 server
//! (MariaDB 10.11 has no such plugin). mysql_async does the whole exchange; what is pinned here
//! is the one piece that is pure: the fast-auth scramble it sends, against the algorithm as the
//! server checks it (MySQL `sql/auth/sha2_password_common.cc`, `generate_sha2_scramble`):
//! `SHA256(pw) XOR SHA256(SHA256(SHA256(pw)) || nonce)`.
//!
//! Not tested, because it needs a MySQL 8 server: the full authentication after a cache miss,
//! which sends the password in clear over TLS, or over plain TCP encrypted with the RSA key the
//! server sends on request (mysql_async asks for it; nothing pins that key, so on plain TCP a
//! man in the middle can read the password: use `ssl-mode=verify_identity`).

#![allow(clippy::unwrap_used, clippy::panic)]

use mysql_common::packets::{AuthPlugin, AuthPluginData};
use sha2::{Digest, Sha256};

fn expected(password: &[u8], nonce: &[u8]) -> Vec<u8> {
    let h1 = Sha256::digest(password);
    let h2 = Sha256::digest(h1);
    let h3 = Sha256::new()
        .chain_update(h2)
        .chain_update(nonce)
        .finalize();
    h1.iter().zip(h3.iter()).map(|(a, b)| a ^ b).collect()
}

#[test]
fn caching_sha2_fast_auth_scramble_is_the_servers_algorithm() {
    let nonce: Vec<u8> = (1..=20).collect();
    for password in ["cdc-pw", "pässwörd ✓", "x"] {
        let data = AuthPlugin::CachingSha2Password
            .gen_data(Some(password), &nonce)
            .unwrap();
        let AuthPluginData::Sha2(bytes) = data else {
            panic!("caching_sha2_password sent {data:?}")
        };
        assert_eq!(
            bytes.to_vec(),
            expected(password.as_bytes(), &nonce),
            "{password}"
        );
    }
    // An empty password sends nothing (the server then checks for an empty one).
    assert!(AuthPlugin::CachingSha2Password
        .gen_data(Some(""), &nonce)
        .is_none());
}
