from __future__ import annotations

from corral.run.rundisk import mount_points

MOUNTINFO = """\
22 1 254:0 / / rw,relatime - ext4 /dev/vda rw
90 22 7:3 / /tmp/runs/with\\040space rw,nosuid,nodev - ext4 /dev/loop3 rw
"""


def test_mount_points_unescape_mountinfo_octal() -> None:
    assert mount_points(MOUNTINFO) == ["/", "/tmp/runs/with space"]
