//! Fields added to nested records in a later format version.
//!
//! postcard is positional: a record of an older version lacks the bytes of a field added since,
//! and a reader that expects them fails or, worse, reads the next field's bytes as this one's.
//! The top-level records handle additions by decoding old layouts as types of their own
//! (`snapshot::NodeImage::decode`); for a field deep inside (a descriptor's record inside a
//! process's inside the node's) that would mean copying every type on the way down. Instead the
//! record readers say which version they decode ([`decoding`]), and such a field is declared
//! `#[serde(deserialize_with = "since::<13, _, _>")]`: read from a record of that version or
//! later, and its `Default` (without consuming a byte) from an older one. postcard lets a field
//! consume nothing: each field is read from the input in turn, whatever its deserializer does.
//!
//! The version is per thread (each decode runs on one thread, start to end), restored when the
//! decode returns.

use std::cell::Cell;

use serde::{Deserialize, Deserializer};

thread_local! {
    /// The format version of the record being decoded on this thread: the current one outside a
    /// record reader (a record just encoded, in tests, decodes with every field).
    static DECODING: Cell<u32> = const { Cell::new(super::FORMAT_VERSION) };
}

/// Runs `decode` with the fields of `version` (see the module).
pub fn decoding<T>(version: u32, decode: impl FnOnce() -> T) -> T {
    struct Restore(u32);
    impl Drop for Restore {
        fn drop(&mut self) {
            DECODING.with(|d| d.set(self.0));
        }
    }
    let _restore = Restore(DECODING.with(|d| d.replace(version)));
    decode()
}

/// A field added in format `V`: read when the record is of version `V` or later, its default
/// (nothing read) when older.
pub fn since<'de, const V: u32, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
    if DECODING.with(Cell::get) < V {
        Ok(T::default())
    } else {
        T::deserialize(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;

    #[derive(Serialize)]
    struct Old {
        a: u32,
        b: String,
    }

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct New {
        a: u32,
        #[serde(deserialize_with = "since::<99, _, _>")]
        added: Option<u64>,
        b: String,
    }

    #[test]
    fn an_added_field_reads_as_its_default_from_an_older_record() {
        let old = postcard::to_stdvec(&Old { a: 7, b: "kept".into() }).unwrap();
        let back: New = decoding(98, || postcard::from_bytes(&old)).unwrap();
        assert_eq!(back, New { a: 7, added: None, b: "kept".into() });
        // The version is put back after the decode.
        assert_eq!(DECODING.with(Cell::get), super::super::FORMAT_VERSION);
    }

    #[test]
    fn an_added_field_is_read_from_a_record_of_its_version() {
        let new = New { a: 7, added: Some(42), b: "kept".into() };
        let bytes = postcard::to_stdvec(&new).unwrap();
        assert_eq!(decoding(99, || postcard::from_bytes::<New>(&bytes)).unwrap(), new);
        // Read as older, the bytes do not fit: the version must be the record's.
        assert!(decoding(98, || postcard::from_bytes::<New>(&bytes)).map_or(true, |b| b != new));
    }
}
