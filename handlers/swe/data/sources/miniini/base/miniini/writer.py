"""Write ``{section: {key: value}}`` back as INI text."""


def dumps(config):
    lines = []
    for section, values in config.items():
        if section:
            if lines:
                lines.append("")
            lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"
