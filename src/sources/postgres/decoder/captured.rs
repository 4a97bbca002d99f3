//! pgoutput messages captured from a real PostgreSQL 15.18 server, as hex. Shared by the decoder
//! tests and by `assembler/mod.rs` tests that need real protocol bytes.
//!
//! Captured with `pg_logical_slot_peek_binary_changes` (the SQL interface returns the same
//! payloads the replication protocol sends in XLogData), on slot `dec_test` and publication
//! `dec_pub` (since dropped).

/// Messages captured from PostgreSQL 15.18 with
/// `SELECT encode(data, 'hex') FROM pg_logical_slot_peek_binary_changes('dec_test', NULL, NULL,
/// 'proto_version', '1', 'publication_names', 'dec_pub', 'messages', 'true')`, on tables
/// `dec_items (id int PRIMARY KEY, name text, big text STORAGE EXTERNAL, score float8)` (oid 16391)
/// and `dec_full (id int, note text)` with REPLICA IDENTITY FULL (oid 16398).
pub mod captured_v1 {
    /// Transaction 744 (`UPDATE dec_items SET name = 'beta' WHERE id = 1`) begins.
    pub const BEGIN: &str = "42000000000199771800030476460e6223000002e8";
    pub const COMMIT: &str = "43000000000001997718000000000199774800030476460e6223";
    pub const RELATION_ITEMS: &str = "52000040077075626c6963006465635f6974656d7300640004016964000000\
        0017ffffffff006e616d650000000019ffffffff006269670000000019ffffffff0073636f726500000002bdffffffff";
    /// `INSERT INTO dec_items VALUES (2, NULL, 'small', NULL)`.
    pub const INSERT_NULLS: &str = "49000040074e00047400000001326e7400000005736d616c6c6e";
    /// The update of row 1: `big` (9000 bytes, TOASTed) did not change and is sent as 'u'.
    pub const UPDATE_TOAST: &str =
        "55000040074e0004740000000131740000000462657461757400000003312e35";
    /// `UPDATE dec_items SET id = 10 WHERE id = 2`: the key changed, so the old key is sent.
    pub const UPDATE_KEY: &str = "55000040074b00047400000001326e6e6e4e0004740000000231306e740000\
        0005736d616c6c6e";
    pub const DELETE_KEY: &str = "44000040074b0004740000000231306e6e6e";
    pub const RELATION_FULL: &str =
        "520000400e7075626c6963006465635f66756c6c0066000201696400000000\
        17ffffffff016e6f74650000000019ffffffff";
    /// `UPDATE dec_full SET note = 'SEVEN' WHERE id = 7` with REPLICA IDENTITY FULL.
    pub const UPDATE_OLD: &str =
        "550000400e4f00027400000001377400000005736576656e4e0002740000000137\
        7400000005534556454e";
    /// `SELECT pg_logical_emit_message(true, 'dec_prefix', 'hello')`.
    pub const MESSAGE: &str = "4d010000000001997a486465635f707265666978000000000568656c6c6f";
    /// `TRUNCATE dec_full`.
    pub const TRUNCATE: &str = "5400000001000000400e";
}

/// Messages captured as above with `SET logical_decoding_work_mem = '64kB'` and `'proto_version',
/// '2', 'streaming', 'on'`: transaction 755 inserted 2,000 rows into `dec_stream (id int PRIMARY
/// KEY, mood dec_mood, pad text)` (oid 16417; `dec_mood` is an enum, oid 16411), transaction 756
/// did the same and rolled back, and transaction 757 rolled back to a savepoint (subxact 758).
pub mod captured_v2 {
    pub const STREAM_START_FIRST: &str = "53000002f301";
    pub const STREAM_START_NEXT: &str = "53000002f300";
    pub const STREAM_STOP: &str = "45";
    pub const MESSAGE: &str = "4d000002f30100000000019a37c86465635f730000000009696e2d73747265616d";
    pub const TYPE: &str = "59000002f30000401b7075626c6963006465635f6d6f6f6400";
    pub const RELATION: &str = "52000002f3000040217075626c6963006465635f73747265616d00640003016964\
        0000000017ffffffff006d6f6f64000000401bffffffff007061640000000019ffffffff";
    /// `INSERT INTO dec_stream VALUES (9000, 'ok', 'top')` in transaction 757.
    pub const INSERT: &str =
        "49000002f5000040214e000374000000043930303074000000026f6b7400000003746f70";
    /// `UPDATE dec_stream SET mood = 'happy' WHERE id = 1`, without its 100 `'p'` pad bytes.
    pub const UPDATE_HEAD: &str =
        "55000002f3000040214e00037400000001317400000005686170707974000000\
        64";
    pub const DELETE: &str = "44000002f3000040214b00037400000001326e6e";
    pub const STREAM_COMMIT: &str = "63000002f3000000000001a162980000000001a162c80003047646ce7fc4";
    pub const STREAM_ABORT_TOP: &str = "41000002f4000002f4";
    pub const STREAM_ABORT_SUBXACT: &str = "41000002f5000002f6";
}

/// Bytes from a hex string (whitespace ignored).
pub fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s
        .bytes()
        .filter(|b| !b.is_ascii_whitespace() && *b != b'\\')
        .collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}
