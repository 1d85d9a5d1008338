//! The OpenAPI 3 document served at `/openapi.json`.
//!
//! Kept by hand next to the router; a test compares its paths and methods with
//! [`super::router::ROUTES`], so a route cannot be added or removed without the document.

pub const DOCUMENT: &str = include_str!("openapi.json");
