//! The IPv4 address of a network interface (`getifaddrs`), so the TCP transport can listen and
//! be reached on the rank's mapped NIC.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr};

/// The first IPv4 address of interface `name`, if it has one.
pub fn ipv4_of(name: &str) -> Option<IpAddr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs;
        // its name is a NUL-terminated string and its address, when not null, a sockaddr whose
        // family says its layout (AF_INET: sockaddr_in).
        unsafe {
            let ifa = &*cur;
            if !ifa.ifa_addr.is_null()
                && i32::from((*ifa.ifa_addr).sa_family) == libc::AF_INET
                && CStr::from_ptr(ifa.ifa_name).to_bytes() == name.as_bytes()
            {
                let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                found = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))));
                break;
            }
            cur = ifa.ifa_next;
        }
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_its_address_and_unknown_interfaces_none() {
        assert_eq!(ipv4_of("lo"), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert_eq!(ipv4_of("pccl-no-such-if"), None);
    }
}
