"""Version parsing and precedence, after https://semver.org (2.0.0)."""
import functools
import re
from dataclasses import dataclass

_PATTERN = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


class InvalidVersion(ValueError):
    pass


@functools.total_ordering
@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int
    prerelease: tuple = ()
    build: tuple = ()

    @classmethod
    def parse(cls, text):
        match = _PATTERN.match(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise InvalidVersion(f"{text!r} is not a semantic version")
        major, minor, patch, pre, build = match.groups()
        return cls(int(major), int(minor), int(patch),
                   tuple(pre.split(".")) if pre else (), tuple(build.split(".")) if build else ())

    def __str__(self):
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def __eq__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return compare(self, other) == 0

    def __lt__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return compare(self, other) < 0

    def __hash__(self):
        # build metadata does not take part in precedence, so it must not change the hash
        return hash((self.major, self.minor, self.patch, self.prerelease))

    def bump(self, part):
        if part == "major":
            return Version(self.major + 1, 0, 0)
        if part == "minor":
            return Version(self.major, self.minor + 1, 0)
        if part == "patch":
            return Version(self.major, self.minor, self.patch + 1)
        raise ValueError(f"unknown part {part!r}")


def compare(a, b):
    """-1, 0 or 1 as ``a`` has lower, equal or higher precedence than ``b``."""
    if isinstance(a, str):
        a = Version.parse(a)
    if isinstance(b, str):
        b = Version.parse(b)
    left, right = (a.major, a.minor, a.patch), (b.major, b.minor, b.patch)
    if left != right:
        return -1 if left < right else 1
    return _compare_prerelease(a.prerelease, b.prerelease)


def _compare_prerelease(a, b):
    if a == b:
        return 0
    if not a:  # a normal version has higher precedence than any of its pre-releases
        return 1
    if not b:
        return -1
    for x, y in zip(a, b):
        if x == y:
            continue
        return -1 if x < y else 1
    return -1 if len(a) < len(b) else 1
