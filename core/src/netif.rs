//! Facts about a network interface: index, IPv4 address, MAC and MTU, read
//! with `getifaddrs` and ioctls so they are right in any network namespace.

use std::{ffi::CStr, io, net::Ipv4Addr};

use crate::{Error, Result};

/// One interface of this network namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// Its name, e.g. `eth0`.
    pub name: String,
    /// Its index.
    pub index: u32,
    /// Its first IPv4 address.
    pub ipv4: Ipv4Addr,
    /// Its IPv4 netmask.
    pub netmask: Ipv4Addr,
    /// Its hardware address (zero for loopback).
    pub mac: [u8; 6],
    /// Its MTU.
    pub mtu: u32,
}

impl Interface {
    /// Whether `addr` is in this interface's IPv4 subnet.
    pub fn reaches(&self, addr: Ipv4Addr) -> bool {
        let mask = u32::from(self.netmask);
        u32::from(self.ipv4) & mask == u32::from(addr) & mask
    }

    /// Whether this is a loopback interface.
    pub fn is_loopback(&self) -> bool {
        self.ipv4.is_loopback()
    }
}

/// Formats a MAC address as `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

fn mtu_of(name: &str) -> io::Result<u32> {
    // SAFETY: plain ioctl on a throwaway socket with a zeroed ifreq whose
    // name fits (checked below).
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes().take(libc::IFNAMSIZ - 1)) {
            *dst = src as libc::c_char;
        }
        let rc = libc::ioctl(fd, libc::SIOCGIFMTU, &mut req);
        let err = io::Error::last_os_error();
        libc::close(fd);
        if rc < 0 {
            return Err(err);
        }
        Ok(req.ifr_ifru.ifru_mtu as u32)
    }
}

/// `ETHTOOL_GDRVINFO` (linux/ethtool.h): asks a device for its driver.
const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;

/// `struct ethtool_drvinfo` (linux/ethtool.h).
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// The (driver, bus) of `name` as ethtool reports them, asked in this
/// thread's network namespace (sysfs shows the namespace it was mounted
/// in, which a thread that entered another namespace does not share).
pub fn driver_of(name: &str) -> io::Result<(String, String)> {
    // SAFETY: EthtoolDrvinfo is integers and byte arrays: all zeros is valid.
    let mut info: EthtoolDrvinfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    // SAFETY: an ioctl on a throwaway socket with a zeroed ifreq whose name
    // fits and whose data points at `info`, which outlives the call.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes().take(libc::IFNAMSIZ - 1)) {
            *dst = src as libc::c_char;
        }
        req.ifr_ifru.ifru_data = (&mut info as *mut EthtoolDrvinfo).cast();
        let rc = libc::ioctl(fd, libc::SIOCETHTOOL, &mut req);
        let err = io::Error::last_os_error();
        libc::close(fd);
        if rc < 0 {
            return Err(err);
        }
    }
    let text = |bytes: &[u8]| {
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    };
    Ok((text(&info.driver), text(&info.bus_info)))
}

/// Whether `name` is a virtual device (veth, bridge, tunnel, loopback):
/// one on no bus. A device ethtool cannot ask counts as virtual too.
pub fn is_virtual(name: &str) -> bool {
    driver_of(name).map(|(_, bus)| bus.is_empty()).unwrap_or(true)
}

/// Every interface of this network namespace that has an IPv4 address.
pub fn list() -> Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills head with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::system("getifaddrs", io::Error::last_os_error()));
    }
    let mut found: Vec<Interface> = Vec::new();
    let mut macs: Vec<(String, [u8; 6])> = Vec::new();
    let mut cursor = head;
    while !cursor.is_null() {
        // SAFETY: cursor walks the list getifaddrs returned; each entry's
        // name is a C string and addr, when non-null, matches its family.
        unsafe {
            let entry = &*cursor;
            cursor = entry.ifa_next;
            if entry.ifa_addr.is_null() {
                continue;
            }
            let name = CStr::from_ptr(entry.ifa_name).to_string_lossy().into_owned();
            match (*entry.ifa_addr).sa_family as i32 {
                libc::AF_INET => {
                    if found.iter().any(|i| i.name == name) {
                        continue;
                    }
                    let addr = &*(entry.ifa_addr as *const libc::sockaddr_in);
                    let mask = if entry.ifa_netmask.is_null() {
                        0
                    } else {
                        (*(entry.ifa_netmask as *const libc::sockaddr_in)).sin_addr.s_addr
                    };
                    let index = libc::if_nametoindex(entry.ifa_name);
                    found.push(Interface {
                        mtu: mtu_of(&name).unwrap_or(1500),
                        name,
                        index,
                        ipv4: Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
                        netmask: Ipv4Addr::from(u32::from_be(mask)),
                        mac: [0; 6],
                    });
                }
                libc::AF_PACKET => {
                    let ll = &*(entry.ifa_addr as *const libc::sockaddr_ll);
                    if ll.sll_halen == 6 {
                        let mut mac = [0u8; 6];
                        mac.copy_from_slice(&ll.sll_addr[..6]);
                        macs.push((name, mac));
                    }
                }
                _ => {}
            }
        }
    }
    // SAFETY: head came from getifaddrs.
    unsafe { libc::freeifaddrs(head) };
    for iface in &mut found {
        if let Some((_, mac)) = macs.iter().find(|(name, _)| *name == iface.name) {
            iface.mac = *mac;
        }
    }
    Ok(found)
}

/// The interface named `name`, or else the one whose subnet holds `toward`
/// (loopback when `toward` is a loopback address).
pub fn choose(name: Option<&str>, toward: Ipv4Addr) -> Result<Interface> {
    let all = list()?;
    if let Some(name) = name {
        return all.into_iter().find(|i| i.name == name).ok_or_else(|| {
            Error::InvalidArgument(format!("interface {name:?} has no IPv4 address here (AGGBOX_IFACE)"))
        });
    }
    let names: Vec<String> = all.iter().map(|i| i.name.clone()).collect();
    all.into_iter()
        .filter(|i| i.is_loopback() == toward.is_loopback())
        .find(|i| i.reaches(toward))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "no interface reaches {toward} (interfaces with IPv4: {}); set AGGBOX_IFACE",
                names.join(", ")
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_virtual_and_a_missing_device_is_an_error() {
        assert!(is_virtual("lo"));
        assert!(driver_of("no-such-if0").is_err());
    }

    #[test]
    fn loopback_is_found() {
        let lo = choose(None, Ipv4Addr::LOCALHOST).unwrap();
        assert_eq!(lo.ipv4, Ipv4Addr::LOCALHOST);
        assert!(lo.index > 0);
        assert!(lo.mtu > 0);
    }

    #[test]
    fn mac_text() {
        let mac = [0x02, 0xab, 0, 1, 0xfe, 0x10];
        assert_eq!(format_mac(&mac), "02:ab:00:01:fe:10");
        assert_eq!(parse_mac("02:ab:00:01:fe:10"), Some(mac));
        assert_eq!(parse_mac("02:ab:00:01:fe"), None);
        assert_eq!(parse_mac("02:ab:00:01:fe:10:11"), None);
        assert_eq!(parse_mac("zz:ab:00:01:fe:10"), None);
    }
}
