//! The on-disk image format. See docs/IMAGE-FORMAT.md.
