//! The control socket of the mount daemon (docs/CONTROL.md): the protocol
//! as types ([`protocol`]: the source of truth for the wire), the client
//! that finds a store's daemons and asks them ([`client`]), and the typed
//! pipe between the daemon and its sweep helper ([`sweep_helper`]).

pub mod client;
pub mod protocol;
pub mod sweep_helper;

pub use client::{ask, ask_as, ask_within, sockets, wait_for_socket, TIMEOUT};
pub use protocol::{
    Command, ErrorKind, Failure, RequestError, Response, MAX_REQUEST_BYTES, PROTOCOL_VERSION,
};
