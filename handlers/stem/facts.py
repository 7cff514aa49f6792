"""Structured facts the STEM corpus is rendered from (``build_data.py``): one source of truth.

Elements: IUPAC standard atomic weights (abridged/conventional values, as shipped by the
``periodictable`` package); elements with no stable isotope carry None (no standard atomic
weight). Constants: CODATA 2022 recommended values (as in ``scipy.constants``). Everything else
was written for this project from standard references; passages keep to well-established values.
"""
from __future__ import annotations

#: (atomic number, symbol, IUPAC name, standard atomic weight or None)
ELEMENTS: tuple[tuple[int, str, str, float | None], ...] = (
    (1, 'H', 'hydrogen', 1.008),
    (2, 'He', 'helium', 4.002602),
    (3, 'Li', 'lithium', 6.94),
    (4, 'Be', 'beryllium', 9.0121831),
    (5, 'B', 'boron', 10.81),
    (6, 'C', 'carbon', 12.011),
    (7, 'N', 'nitrogen', 14.007),
    (8, 'O', 'oxygen', 15.999),
    (9, 'F', 'fluorine', 18.998403162),
    (10, 'Ne', 'neon', 20.1797),
    (11, 'Na', 'sodium', 22.98976928),
    (12, 'Mg', 'magnesium', 24.305),
    (13, 'Al', 'aluminum', 26.9815384),
    (14, 'Si', 'silicon', 28.085),
    (15, 'P', 'phosphorus', 30.973761998),
    (16, 'S', 'sulfur', 32.06),
    (17, 'Cl', 'chlorine', 35.45),
    (18, 'Ar', 'argon', 39.95),
    (19, 'K', 'potassium', 39.0983),
    (20, 'Ca', 'calcium', 40.078),
    (21, 'Sc', 'scandium', 44.955907),
    (22, 'Ti', 'titanium', 47.867),
    (23, 'V', 'vanadium', 50.9415),
    (24, 'Cr', 'chromium', 51.9961),
    (25, 'Mn', 'manganese', 54.938043),
    (26, 'Fe', 'iron', 55.845),
    (27, 'Co', 'cobalt', 58.933194),
    (28, 'Ni', 'nickel', 58.6934),
    (29, 'Cu', 'copper', 63.546),
    (30, 'Zn', 'zinc', 65.38),
    (31, 'Ga', 'gallium', 69.723),
    (32, 'Ge', 'germanium', 72.63),
    (33, 'As', 'arsenic', 74.921595),
    (34, 'Se', 'selenium', 78.971),
    (35, 'Br', 'bromine', 79.904),
    (36, 'Kr', 'krypton', 83.798),
    (37, 'Rb', 'rubidium', 85.4678),
    (38, 'Sr', 'strontium', 87.62),
    (39, 'Y', 'yttrium', 88.905838),
    (40, 'Zr', 'zirconium', 91.224),
    (41, 'Nb', 'niobium', 92.90637),
    (42, 'Mo', 'molybdenum', 95.95),
    (43, 'Tc', 'technetium', None),
    (44, 'Ru', 'ruthenium', 101.07),
    (45, 'Rh', 'rhodium', 102.90549),
    (46, 'Pd', 'palladium', 106.42),
    (47, 'Ag', 'silver', 107.8682),
    (48, 'Cd', 'cadmium', 112.414),
    (49, 'In', 'indium', 114.818),
    (50, 'Sn', 'tin', 118.71),
    (51, 'Sb', 'antimony', 121.76),
    (52, 'Te', 'tellurium', 127.6),
    (53, 'I', 'iodine', 126.90447),
    (54, 'Xe', 'xenon', 131.293),
    (55, 'Cs', 'cesium', 132.90545196),
    (56, 'Ba', 'barium', 137.327),
    (57, 'La', 'lanthanum', 138.90547),
    (58, 'Ce', 'cerium', 140.116),
    (59, 'Pr', 'praseodymium', 140.90766),
    (60, 'Nd', 'neodymium', 144.242),
    (61, 'Pm', 'promethium', None),
    (62, 'Sm', 'samarium', 150.36),
    (63, 'Eu', 'europium', 151.964),
    (64, 'Gd', 'gadolinium', 157.25),
    (65, 'Tb', 'terbium', 158.925354),
    (66, 'Dy', 'dysprosium', 162.5),
    (67, 'Ho', 'holmium', 164.930329),
    (68, 'Er', 'erbium', 167.259),
    (69, 'Tm', 'thulium', 168.934219),
    (70, 'Yb', 'ytterbium', 173.045),
    (71, 'Lu', 'lutetium', 174.9668),
    (72, 'Hf', 'hafnium', 178.486),
    (73, 'Ta', 'tantalum', 180.94788),
    (74, 'W', 'tungsten', 183.84),
    (75, 'Re', 'rhenium', 186.207),
    (76, 'Os', 'osmium', 190.23),
    (77, 'Ir', 'iridium', 192.217),
    (78, 'Pt', 'platinum', 195.084),
    (79, 'Au', 'gold', 196.96657),
    (80, 'Hg', 'mercury', 200.592),
    (81, 'Tl', 'thallium', 204.38),
    (82, 'Pb', 'lead', 207.2),
    (83, 'Bi', 'bismuth', 208.9804),
    (84, 'Po', 'polonium', None),
    (85, 'At', 'astatine', None),
    (86, 'Rn', 'radon', None),
    (87, 'Fr', 'francium', None),
    (88, 'Ra', 'radium', None),
    (89, 'Ac', 'actinium', None),
    (90, 'Th', 'thorium', 232.0377),
    (91, 'Pa', 'protactinium', 231.03588),
    (92, 'U', 'uranium', 238.02891),
    (93, 'Np', 'neptunium', None),
    (94, 'Pu', 'plutonium', None),
    (95, 'Am', 'americium', None),
    (96, 'Cm', 'curium', None),
    (97, 'Bk', 'berkelium', None),
    (98, 'Cf', 'californium', None),
    (99, 'Es', 'einsteinium', None),
    (100, 'Fm', 'fermium', None),
    (101, 'Md', 'mendelevium', None),
    (102, 'No', 'nobelium', None),
    (103, 'Lr', 'lawrencium', None),
    (104, 'Rf', 'rutherfordium', None),
    (105, 'Db', 'dubnium', None),
    (106, 'Sg', 'seaborgium', None),
    (107, 'Bh', 'bohrium', None),
    (108, 'Hs', 'hassium', None),
    (109, 'Mt', 'meitnerium', None),
    (110, 'Ds', 'darmstadtium', None),
    (111, 'Rg', 'roentgenium', None),
    (112, 'Cn', 'copernicium', None),
    (113, 'Nh', 'nihonium', None),
    (114, 'Fl', 'flerovium', None),
    (115, 'Mc', 'moscovium', None),
    (116, 'Lv', 'livermorium', None),
    (117, 'Ts', 'tennessine', None),
    (118, 'Og', 'oganesson', None),
)

#: (id, name as written mid-sentence, symbol, value as written, unit, exact in the SI, what it is)
CONSTANTS: tuple[tuple[str, str, str, str, str, bool, str], ...] = (
    ("speed-of-light", "speed of light in vacuum", "c", "299792458", "m/s", True,
     "The speed at which light and all electromagnetic radiation travel in vacuum. Since 1983 the "
     "metre is defined from it, so its value is exact."),
    ("planck-constant", "Planck constant", "h", "6.62607015e-34", "J s", True,
     "The quantum of action: the energy of a photon is E = h f, where f is its frequency. It "
     "defines the kilogram in the SI since 2019."),
    ("reduced-planck-constant", "reduced Planck constant", "ħ", "1.054571817e-34", "J s", True,
     "The Planck constant divided by 2π (h-bar), the unit of angular momentum in quantum mechanics."),
    ("elementary-charge", "elementary charge", "e", "1.602176634e-19", "C", True,
     "The electric charge of a proton; an electron carries −e. It defines the ampere since 2019."),
    ("boltzmann-constant", "Boltzmann constant", "k_B", "1.380649e-23", "J/K", True,
     "Relates the average kinetic energy of particles in a gas to temperature. It defines the "
     "kelvin since 2019."),
    ("avogadro-constant", "Avogadro constant", "N_A", "6.02214076e23", "1/mol", True,
     "The number of constituent particles in one mole of a substance. It defines the mole since 2019."),
    ("gravitational-constant", "Newtonian constant of gravitation", "G", "6.67430e-11", "m^3 kg^-1 s^-2",
     False, "The constant in Newton's law of universal gravitation, F = G m1 m2 / r^2. It is the "
     "least precisely known fundamental constant (relative uncertainty about 2.2e-5)."),
    ("standard-gravity", "standard acceleration of gravity", "g_n", "9.80665", "m/s^2", True,
     "A conventional value of the acceleration due to gravity at the Earth's surface, fixed by "
     "definition in 1901; used to define the kilogram-force."),
    ("electron-mass", "electron mass", "m_e", "9.1093837139e-31", "kg", False,
     "The rest mass of the electron, about 1/1836 of the proton mass."),
    ("proton-mass", "proton mass", "m_p", "1.67262192595e-27", "kg", False,
     "The rest mass of the proton, the nucleus of the hydrogen-1 atom."),
    ("neutron-mass", "neutron mass", "m_n", "1.67492750056e-27", "kg", False,
     "The rest mass of the neutron, slightly larger than the proton mass."),
    ("atomic-mass-constant", "atomic mass constant (dalton)", "m_u", "1.66053906892e-27", "kg", False,
     "One twelfth of the mass of a carbon-12 atom; the unified atomic mass unit u, also called the dalton (Da)."),
    ("gas-constant", "molar gas constant", "R", "8.31446261815324", "J mol^-1 K^-1", True,
     "The constant in the ideal gas law p V = n R T; it equals the Avogadro constant times the "
     "Boltzmann constant."),
    ("stefan-boltzmann-constant", "Stefan–Boltzmann constant", "σ", "5.670374419e-8", "W m^-2 K^-4", True,
     "The power radiated per unit area by a black body is σ T^4, where T is its absolute temperature."),
    ("vacuum-permittivity", "vacuum electric permittivity", "ε0", "8.8541878188e-12", "F/m", False,
     "The electric constant in Coulomb's law, F = q1 q2 / (4 π ε0 r^2). The Coulomb constant "
     "1/(4 π ε0) is about 8.988e9 N m^2 C^-2."),
    ("vacuum-permeability", "vacuum magnetic permeability", "μ0", "1.25663706127e-6", "N/A^2", False,
     "The magnetic constant; very close to 4π × 10^-7 N/A^2, its exact value before 2019."),
    ("rydberg-constant", "Rydberg constant", "R_∞", "10973731.568157", "1/m", False,
     "Sets the wavelengths of the hydrogen spectral lines through the Rydberg formula."),
    ("bohr-radius", "Bohr radius", "a0", "5.29177210544e-11", "m", False,
     "The most probable distance between the proton and the electron in a hydrogen atom in its "
     "ground state, in the Bohr model about 0.529 ångström."),
    ("fine-structure-constant", "fine-structure constant", "α", "7.2973525643e-3", "(dimensionless)", False,
     "The strength of the electromagnetic interaction, about 1/137.036."),
    ("faraday-constant", "Faraday constant", "F", "96485.33212", "C/mol", True,
     "The electric charge of one mole of elementary charges; it equals N_A times e. Used in electrolysis."),
    ("wien-constant", "Wien wavelength displacement constant", "b", "2.897771955e-3", "m K", True,
     "A black body at temperature T radiates most strongly at the wavelength λ_max = b / T."),
    ("electronvolt", "electronvolt", "eV", "1.602176634e-19", "J", True,
     "The energy gained by an electron accelerated through a potential difference of one volt; "
     "1 eV = 1.602176634e-19 J exactly."),
    ("standard-atmosphere", "standard atmosphere", "atm", "101325", "Pa", True,
     "A unit of pressure defined as exactly 101325 pascals, roughly the mean air pressure at sea level."),
    ("planck-length", "Planck length", "l_P", "1.616255e-35", "m", False,
     "The unit of length in Planck units, sqrt(ħ G / c^3)."),
    ("planck-mass", "Planck mass", "m_P", "2.176434e-8", "kg", False,
     "The unit of mass in Planck units, sqrt(ħ c / G), about 22 micrograms."),
    ("planck-time", "Planck time", "t_P", "5.391247e-44", "s", False,
     "The time light takes to travel one Planck length."),
    ("classical-electron-radius", "classical electron radius", "r_e", "2.8179403205e-15", "m", False,
     "The length scale at which the electrostatic self-energy of the electron equals its rest energy."),
    ("compton-wavelength", "Compton wavelength of the electron", "λ_C", "2.42631023538e-12", "m", False,
     "h / (m_e c): the wavelength shift scale in Compton scattering of photons by electrons."),
    ("bohr-magneton", "Bohr magneton", "μ_B", "9.2740100657e-24", "J/T", False,
     "The natural unit of the magnetic moment of an electron, e ħ / (2 m_e)."),
    ("nuclear-magneton", "nuclear magneton", "μ_N", "5.0507837393e-27", "J/T", False,
     "The natural unit of nuclear magnetic moments, e ħ / (2 m_p)."),
    ("proton-electron-mass-ratio", "proton-to-electron mass ratio", "m_p/m_e", "1836.152673426",
     "(dimensionless)", False, "The proton is about 1836 times heavier than the electron."),
    ("molar-volume-ideal-gas", "molar volume of an ideal gas", "V_m", "22.41396954e-3", "m^3/mol", True,
     "The volume of one mole of ideal gas at 273.15 K and 101.325 kPa, about 22.414 litres."),
    ("loschmidt-constant", "Loschmidt constant", "n_0", "2.686780111e25", "1/m^3", True,
     "The number of particles per cubic metre of an ideal gas at 273.15 K and 101.325 kPa."),
    ("von-klitzing-constant", "von Klitzing constant", "R_K", "25812.80745", "ohm", True,
     "h / e^2, the resistance quantum of the quantum Hall effect."),
    ("josephson-constant", "Josephson constant", "K_J", "483597.8484e9", "Hz/V", True,
     "2e / h, the frequency-to-voltage ratio of the Josephson effect."),
    ("hartree-energy", "Hartree energy", "E_h", "4.3597447222060e-18", "J", False,
     "The atomic unit of energy, about 27.211 eV: twice the ionization energy of hydrogen in the Bohr model."),
    ("muon-mass", "muon mass", "m_μ", "1.883531627e-28", "kg", False,
     "The rest mass of the muon, about 207 times the electron mass."),
    ("alpha-particle-mass", "alpha particle mass", "m_α", "6.644657345e-27", "kg", False,
     "The rest mass of a helium-4 nucleus (two protons and two neutrons)."),
    ("vacuum-impedance", "characteristic impedance of vacuum", "Z0", "376.730313412", "ohm", False,
     "μ0 c, the ratio of the electric to the magnetic field of a plane wave in vacuum, about 376.73 ohms."),
    ("electron-charge-to-mass", "electron charge-to-mass quotient", "-e/m_e", "-1.75882000838e11", "C/kg",
     False, "First measured by J. J. Thomson in 1897 with cathode rays."),
)

#: the seven defining constants of the SI (exact by definition since 20 May 2019); other exact
#: constants are derived from them and shown rounded
DEFINING_CONSTANTS = frozenset({"speed-of-light", "planck-constant", "elementary-charge",
                                "boltzmann-constant", "avogadro-constant"})

#: (name, mass 10^24 kg, equatorial diameter km, mean distance from the Sun 10^6 km,
#:  orbital period days, surface gravity m/s^2, length of day hours, known moons or None, note)
#: values from the NASA planetary fact sheet
PLANETS: tuple[tuple[str, float, float, float, float, float, float, str, str], ...] = (
    ("Mercury", 0.330, 4879, 57.9, 88.0, 3.7, 4222.6, "no moons",
     "the smallest planet and the closest to the Sun"),
    ("Venus", 4.87, 12104, 108.2, 224.7, 8.9, 2802.0, "no moons",
     "the hottest planet, with a dense carbon dioxide atmosphere and a surface near 464 °C; it rotates "
     "retrograde (east to west)"),
    ("Earth", 5.97, 12756, 149.6, 365.2, 9.8, 24.0, "one moon, the Moon",
     "the only planet known to harbour life; about 71 percent of its surface is covered by oceans"),
    ("Mars", 0.642, 6792, 228.0, 687.0, 3.7, 24.7, "two moons, Phobos and Deimos",
     "the red planet, coloured by iron oxide; Olympus Mons on Mars is the tallest volcano in the Solar System"),
    ("Jupiter", 1898.0, 142984, 778.5, 4331.0, 23.1, 9.9, "dozens of moons, the four largest being the "
     "Galilean moons Io, Europa, Ganymede and Callisto",
     "the largest planet, a gas giant of mostly hydrogen and helium whose Great Red Spot is a storm "
     "larger than Earth"),
    ("Saturn", 568.0, 120536, 1432.0, 10747.0, 9.0, 10.7, "dozens of moons, the largest being Titan",
     "a gas giant with the most prominent ring system; its mean density is lower than that of water"),
    ("Uranus", 86.8, 51118, 2867.0, 30589.0, 8.7, 17.2, "27 or more moons, among them Titania and Oberon",
     "an ice giant whose rotation axis is tilted by about 98 degrees, so it rotates on its side; "
     "discovered by William Herschel in 1781"),
    ("Neptune", 102.0, 49528, 4515.0, 59800.0, 11.0, 16.1, "at least 14 moons, the largest being Triton",
     "the outermost planet, an ice giant discovered in 1846 by Johann Galle from the predictions of "
     "Urbain Le Verrier"),
)

#: (id, title, text) passages written for this project
PASSAGES: tuple[tuple[str, str, str], ...] = (
    # --- astronomy --------------------------------------------------------------------------
    ("astro-sun", "Sun",
     "The Sun is the star at the centre of the Solar System, a G-type main-sequence star (G2V). Its "
     "mass is about 1.989e30 kg (one solar mass), about 333,000 times the mass of the Earth, and its "
     "radius is about 696,000 km. Its surface (photosphere) temperature is about 5,772 K and it is "
     "about 4.6 billion years old. It shines by fusing hydrogen into helium in its core."),
    ("astro-moon", "Moon",
     "The Moon is Earth's only natural satellite. Its mass is 7.35e22 kg (about 1.2 percent of the "
     "Earth's mass), its mean radius is 1,737.4 km, and its mean distance from the Earth is 384,400 km. "
     "It orbits the Earth in 27.3 days (sidereal month); the cycle of lunar phases (synodic month) "
     "lasts 29.5 days. The surface gravity on the Moon is 1.62 m/s^2, about one sixth of Earth's."),
    ("astro-pluto", "Pluto",
     "Pluto is a dwarf planet in the Kuiper belt, discovered by Clyde Tombaugh in 1930 and classified "
     "as a planet until the International Astronomical Union defined the term planet in 2006. Its "
     "diameter is 2,376 km, its mean distance from the Sun is 5,906 million km, and it orbits the Sun "
     "in about 248 years. Its largest moon is Charon."),
    ("astro-ceres", "Ceres",
     "Ceres is the largest object in the asteroid belt between Mars and Jupiter and the only dwarf "
     "planet in the inner Solar System. It was discovered by Giuseppe Piazzi on 1 January 1801 and has "
     "a diameter of about 940 km. NASA's Dawn spacecraft orbited it from 2015."),
    ("astro-titan", "Titan (moon)",
     "Titan is the largest moon of Saturn and the second-largest moon in the Solar System, with a "
     "diameter of about 5,150 km. It is the only moon with a dense atmosphere, mostly nitrogen, and it "
     "has lakes of liquid methane and ethane. It was discovered by Christiaan Huygens in 1655."),
    ("astro-ganymede", "Ganymede (moon)",
     "Ganymede, a Galilean moon of Jupiter, is the largest moon in the Solar System, with a diameter of "
     "about 5,268 km, larger than the planet Mercury. It is the only moon known to have its own magnetic "
     "field. Galileo Galilei discovered it in January 1610."),
    ("astro-io", "Io (moon)",
     "Io, the innermost Galilean moon of Jupiter, is the most volcanically active body in the Solar "
     "System, heated by tidal flexing. Its diameter is about 3,643 km."),
    ("astro-europa", "Europa (moon)",
     "Europa, a Galilean moon of Jupiter with a diameter of about 3,122 km, has a smooth surface of "
     "water ice believed to cover a global ocean of liquid salt water."),
    ("astro-au", "Astronomical unit",
     "The astronomical unit (au) is a unit of length roughly equal to the mean distance between the "
     "Earth and the Sun. Since 2012 the International Astronomical Union defines it as exactly "
     "149,597,870,700 metres."),
    ("astro-light-year", "Light-year",
     "A light-year (ly) is the distance light travels in vacuum in one Julian year of 365.25 days: "
     "exactly 9,460,730,472,580,800 metres, about 9.461e15 m or 63,241 astronomical units."),
    ("astro-parsec", "Parsec",
     "A parsec (pc) is the distance at which one astronomical unit subtends an angle of one arcsecond. "
     "It equals 648000/π astronomical units, about 3.0857e16 metres or 3.2616 light-years. The name "
     "comes from parallax of one arcsecond."),
    ("astro-proxima", "Proxima Centauri",
     "Proxima Centauri is a red dwarf star and the nearest known star to the Sun, at a distance of about "
     "4.24 light-years in the constellation Centaurus. It has at least one planet in its habitable zone, "
     "Proxima Centauri b, announced in 2016."),
    ("astro-alpha-centauri", "Alpha Centauri",
     "Alpha Centauri is the star system nearest to the Solar System. Its two bright Sun-like stars, "
     "Alpha Centauri A and B, lie about 4.37 light-years away; the red dwarf Proxima Centauri is a "
     "third, more distant member of the system."),
    ("astro-sirius", "Sirius",
     "Sirius, in the constellation Canis Major, is the brightest star in the night sky, with an apparent "
     "magnitude of −1.46. It is a binary system about 8.6 light-years away; its companion Sirius B is a "
     "white dwarf."),
    ("astro-polaris", "Polaris",
     "Polaris, the North Star, is the brightest star in the constellation Ursa Minor and lies within "
     "one degree of the north celestial pole, so it appears almost fixed in the northern sky. It is a "
     "Cepheid variable supergiant."),
    ("astro-betelgeuse", "Betelgeuse",
     "Betelgeuse is a red supergiant star in the constellation Orion, one of the largest stars visible "
     "to the naked eye. It is expected to end its life as a supernova. It dimmed unusually in 2019 and 2020 "
     "(the Great Dimming)."),
    ("astro-kepler-laws", "Kepler's laws of planetary motion",
     "Johannes Kepler published his laws between 1609 and 1619. First, planets move in ellipses with "
     "the Sun at one focus. Second, a line from the Sun to a planet sweeps out equal areas in equal "
     "times. Third, the square of the orbital period is proportional to the cube of the semi-major "
     "axis: with the period T in years and the semi-major axis a in astronomical units, T^2 = a^3 for "
     "planets of the Sun."),
    ("astro-schwarzschild", "Schwarzschild radius",
     "The Schwarzschild radius of a mass M is r_s = 2 G M / c^2, where G is the gravitational "
     "constant and c the speed of light. A non-rotating mass compressed within this radius becomes a "
     "black hole; its event horizon lies at r_s. Karl Schwarzschild found the solution of Einstein's "
     "field equations in 1916."),
    ("astro-chandrasekhar", "Chandrasekhar limit",
     "The Chandrasekhar limit, about 1.4 solar masses, is the maximum mass of a stable white dwarf "
     "star supported by electron degeneracy pressure. Subrahmanyan Chandrasekhar computed it in 1930."),
    ("astro-hubble-law", "Hubble's law",
     "Hubble's law states that galaxies recede from us at speeds proportional to their distance, v = H0 d. "
     "Edwin Hubble published the relation in 1929 (Georges Lemaître had derived it in 1927). Measured "
     "values of the Hubble constant H0 lie between about 67 and 73 km/s per megaparsec."),
    ("astro-milky-way", "Milky Way",
     "The Milky Way is the barred spiral galaxy that contains the Solar System. Its stellar disk is "
     "about 100,000 light-years across and it holds some 100 to 400 billion stars. The Sun lies about "
     "26,000 light-years from the Galactic Centre, where the supermassive black hole Sagittarius A* sits."),
    ("astro-andromeda", "Andromeda Galaxy",
     "The Andromeda Galaxy (M31) is the nearest large spiral galaxy to the Milky Way, about 2.5 million "
     "light-years away, and the most distant object easily visible to the naked eye."),
    ("astro-universe-age", "Age of the universe",
     "Measurements of the cosmic microwave background by the Planck satellite give an age of the "
     "universe of about 13.8 billion years since the Big Bang."),
    ("astro-halley", "Halley's Comet",
     "Halley's Comet is a short-period comet visible from Earth every 75 to 76 years. Edmond Halley "
     "predicted its 1758 return; it last appeared in 1986 and will return in 2061."),
    ("astro-escape-velocity", "Escape velocity",
     "The escape velocity from the surface of a body of mass M and radius r is v = sqrt(2 G M / r). "
     "For the Earth it is about 11.2 km/s; for the Moon about 2.38 km/s."),
    ("astro-apollo11", "Apollo 11",
     "Apollo 11 was the first crewed Moon landing. Neil Armstrong and Buzz Aldrin landed the lunar "
     "module Eagle on 20 July 1969 in the Sea of Tranquillity while Michael Collins orbited in the "
     "command module Columbia."),
    ("astro-sputnik", "Sputnik 1",
     "Sputnik 1, launched by the Soviet Union on 4 October 1957, was the first artificial Earth "
     "satellite. It orbited the Earth every 96 minutes and transmitted radio pulses for 21 days."),
    ("astro-hubble-telescope", "Hubble Space Telescope",
     "The Hubble Space Telescope, launched in 1990 aboard the Space Shuttle Discovery, has a 2.4-metre "
     "primary mirror and orbits the Earth at about 540 km altitude."),
    ("astro-jwst", "James Webb Space Telescope",
     "The James Webb Space Telescope, launched on 25 December 2021, observes mainly in the infrared "
     "with a 6.5-metre segmented gold-coated mirror. It orbits near the Sun–Earth L2 Lagrange point, "
     "about 1.5 million km from Earth."),
)

EXPERIMENTS: tuple[tuple[str, str, str], ...] = (
    ("exp-michelson-morley", "Michelson–Morley experiment",
     "The Michelson–Morley experiment, performed in 1887 by Albert A. Michelson and Edward W. Morley in "
     "Cleveland, Ohio, used an interferometer to compare the speed of light in perpendicular "
     "directions. It found no significant difference (a null result), evidence against the "
     "luminiferous aether and later a cornerstone of special relativity."),
    ("exp-millikan-oil-drop", "Millikan oil-drop experiment",
     "In the oil-drop experiment, begun in 1909, Robert A. Millikan and Harvey Fletcher balanced "
     "charged oil droplets between two metal plates with an electric field against gravity. The "
     "charges were always whole multiples of one value, the elementary charge, which Millikan measured "
     "to within about one percent of the modern value. Millikan received the 1923 Nobel Prize in Physics."),
    ("exp-gold-foil", "Geiger–Marsden gold foil experiment",
     "In the gold foil experiments (1908 to 1913) Hans Geiger and Ernest Marsden, under Ernest "
     "Rutherford in Manchester, fired alpha particles at thin gold foil. A few were deflected through "
     "large angles, which Rutherford explained in 1911 by a small, dense, positively charged atomic "
     "nucleus."),
    ("exp-cavendish", "Cavendish experiment",
     "In 1797 and 1798 Henry Cavendish used a torsion balance built by John Michell to measure the tiny "
     "gravitational attraction between lead spheres. He obtained the mean density of the Earth, 5.448 "
     "times that of water; his result is equivalent to a value of the gravitational constant G within "
     "about one percent of today's."),
    ("exp-young-double-slit", "Young's double-slit experiment",
     "Thomas Young showed around 1801 that light passing through two narrow slits produces a pattern "
     "of bright and dark interference fringes, evidence that light behaves as a wave. The same "
     "experiment with electrons later showed the wave nature of matter."),
    ("exp-davisson-germer", "Davisson–Germer experiment",
     "In 1927 Clinton Davisson and Lester Germer at Bell Labs scattered electrons off a nickel crystal "
     "and observed diffraction peaks, confirming Louis de Broglie's hypothesis that particles have a "
     "wavelength λ = h / p."),
    ("exp-stern-gerlach", "Stern–Gerlach experiment",
     "In 1922 Otto Stern and Walther Gerlach sent a beam of silver atoms through an inhomogeneous "
     "magnetic field. The beam split into two discrete parts instead of spreading continuously, showing "
     "that angular momentum is quantized (later understood as electron spin)."),
    ("exp-franck-hertz", "Franck–Hertz experiment",
     "In 1914 James Franck and Gustav Hertz accelerated electrons through mercury vapour and found that "
     "they lose energy in discrete amounts of about 4.9 electronvolts, confirming quantized atomic "
     "energy levels. They received the 1925 Nobel Prize in Physics."),
    ("exp-meselson-stahl", "Meselson–Stahl experiment",
     "In 1958 Matthew Meselson and Franklin Stahl grew Escherichia coli on heavy nitrogen (nitrogen-15) "
     "and then on nitrogen-14, separating the DNA by density in a caesium chloride gradient. The results "
     "showed that DNA replication is semiconservative."),
    ("exp-hershey-chase", "Hershey–Chase experiment",
     "In 1952 Alfred Hershey and Martha Chase labelled T2 bacteriophages with radioactive phosphorus-32 "
     "(in DNA) or sulfur-35 (in protein) and showed that DNA, not protein, enters the bacterium: DNA is "
     "the genetic material."),
    ("exp-miller-urey", "Miller–Urey experiment",
     "In 1952 Stanley Miller, supervised by Harold Urey at the University of Chicago, passed electric "
     "sparks through a mixture of water, methane, ammonia and hydrogen. Amino acids formed, showing "
     "that organic molecules can arise from simple inorganic precursors."),
    ("exp-avery", "Avery–MacLeod–McCarty experiment",
     "In 1944 Oswald Avery, Colin MacLeod and Maclyn McCarty reported that the substance that "
     "transforms harmless pneumococci into virulent ones is DNA."),
    ("exp-griffith", "Griffith's experiment",
     "In 1928 Frederick Griffith found that heat-killed virulent Streptococcus pneumoniae could transform "
     "a harmless strain into a virulent one in mice: the first evidence of bacterial transformation."),
    ("exp-foucault-pendulum", "Foucault pendulum",
     "In 1851 Léon Foucault hung a 67-metre pendulum with a 28 kg bob in the Panthéon in Paris. The "
     "slow rotation of its plane of swing demonstrated the rotation of the Earth."),
    ("exp-eddington-eclipse", "Eddington experiment",
     "During the total solar eclipse of 29 May 1919, expeditions led by Arthur Eddington and Frank "
     "Dyson measured the deflection of starlight passing the Sun, close to the 1.75 arcseconds "
     "predicted by Einstein's general relativity."),
    ("exp-pound-rebka", "Pound–Rebka experiment",
     "In 1959 Robert Pound and Glen Rebka measured the gravitational redshift of gamma rays travelling "
     "22.5 metres up the Jefferson Laboratory tower at Harvard University, confirming a prediction of "
     "general relativity."),
    ("exp-joule", "Joule's paddle-wheel experiment",
     "In the 1840s James Prescott Joule let a falling weight turn a paddle wheel in insulated water and "
     "measured the temperature rise, establishing the mechanical equivalent of heat and supporting the "
     "conservation of energy. The SI unit of energy, the joule, is named after him."),
    ("exp-compton", "Compton scattering",
     "In 1923 Arthur Compton found that X-rays scattered by electrons in graphite have a longer "
     "wavelength, by an amount depending on the scattering angle: Δλ = (h / (m_e c)) (1 − cos θ). The "
     "effect showed that light carries momentum in quanta. Compton received the 1927 Nobel Prize in Physics."),
    ("exp-photoelectric", "Photoelectric effect",
     "In the photoelectric effect light ejects electrons from a metal only above a threshold frequency, "
     "whatever its intensity. Albert Einstein explained it in 1905 with light quanta of energy E = h f: "
     "the maximum kinetic energy of the electrons is h f minus the work function of the metal. Einstein "
     "received the 1921 Nobel Prize in Physics for this work."),
    ("exp-pasteur", "Pasteur's swan-neck flask experiment",
     "In 1859 Louis Pasteur boiled broth in flasks with long curved (swan) necks that let in air but "
     "trapped dust. No microbes grew unless the neck was broken, refuting spontaneous generation."),
    ("exp-mendel", "Mendel's pea plant experiments",
     "Between 1856 and 1863 Gregor Mendel crossed some 28,000 pea plants in Brno and found the laws of "
     "segregation and independent assortment, with a 3:1 ratio of dominant to recessive traits in the "
     "second generation. He published his results in 1866."),
    ("exp-fizeau", "Fizeau's measurement of the speed of light",
     "In 1849 Hippolyte Fizeau measured the speed of light on Earth with a rotating toothed wheel and a "
     "mirror about 8 km away, obtaining about 313,000 km/s."),
    ("exp-romer", "Rømer's determination of the speed of light",
     "In 1676 Ole Rømer noticed that eclipses of Jupiter's moon Io came earlier or later depending on "
     "the Earth's distance from Jupiter, the first evidence that light travels at a finite speed."),
    ("exp-oersted", "Ørsted's discovery of electromagnetism",
     "In 1820 Hans Christian Ørsted observed that an electric current deflects a nearby compass needle, "
     "the first evidence of a link between electricity and magnetism."),
    ("exp-faraday-induction", "Faraday's law of induction",
     "In 1831 Michael Faraday discovered electromagnetic induction: a changing magnetic flux through a "
     "circuit induces an electromotive force. The SI unit of capacitance, the farad, is named after him."),
    ("exp-hertz-radio", "Hertz's radio wave experiments",
     "Between 1886 and 1889 Heinrich Hertz generated and detected electromagnetic waves with spark-gap "
     "circuits, confirming James Clerk Maxwell's theory. The unit of frequency, the hertz, is named after him."),
    ("exp-chadwick", "Discovery of the neutron",
     "In 1932 James Chadwick at the Cavendish Laboratory identified the neutron, an uncharged particle "
     "of nearly the proton's mass, from radiation produced when alpha particles strike beryllium. He "
     "received the 1935 Nobel Prize in Physics."),
    ("exp-thomson-electron", "Discovery of the electron",
     "In 1897 J. J. Thomson showed that cathode rays are made of particles much lighter than atoms, "
     "which he called corpuscles and which are now called electrons, and measured their charge-to-mass ratio."),
    ("exp-penzias-wilson", "Discovery of the cosmic microwave background",
     "In 1964 Arno Penzias and Robert Wilson at Bell Labs found a uniform microwave background signal "
     "corresponding to a temperature of about 3 kelvin, the afterglow of the Big Bang. Its temperature is "
     "now measured as 2.725 K. They received the 1978 Nobel Prize in Physics."),
    ("exp-fleming-penicillin", "Discovery of penicillin",
     "In 1928 Alexander Fleming noticed that a mould, Penicillium, killed Staphylococcus bacteria on a "
     "culture plate at St Mary's Hospital in London. Penicillin became the first widely used antibiotic."),
    ("exp-wu", "Wu experiment",
     "In 1956 Chien-Shiung Wu and colleagues observed that electrons from the beta decay of polarized "
     "cobalt-60 nuclei are emitted preferentially in one direction, showing that parity is not conserved "
     "in the weak interaction."),
    ("exp-cowan-reines", "Cowan–Reines neutrino experiment",
     "In 1956 Clyde Cowan and Frederick Reines detected antineutrinos from a nuclear reactor at the "
     "Savannah River Plant, the first direct detection of the neutrino."),
    ("exp-ligo", "First observation of gravitational waves",
     "On 14 September 2015 the two LIGO detectors recorded gravitational waves from the merger of two "
     "black holes about 1.3 billion light-years away (event GW150914), announced in February 2016. "
     "Rainer Weiss, Kip Thorne and Barry Barish received the 2017 Nobel Prize in Physics."),
)

UNITS: tuple[tuple[str, str, str], ...] = (
    ("unit-second", "Second (SI base unit of time)",
     "The second (s) is the SI base unit of time. It is defined by fixing the caesium-133 hyperfine "
     "transition frequency at exactly 9,192,631,770 hertz."),
    ("unit-metre", "Metre (SI base unit of length)",
     "The metre (m) is the SI base unit of length: the distance light travels in vacuum in "
     "1/299,792,458 of a second."),
    ("unit-kilogram", "Kilogram (SI base unit of mass)",
     "The kilogram (kg) is the SI base unit of mass. Since 20 May 2019 it is defined by fixing the Planck "
     "constant at exactly 6.62607015e-34 J s, replacing the International Prototype Kilogram, a "
     "platinum-iridium cylinder kept near Paris since 1889."),
    ("unit-ampere", "Ampere (SI base unit of electric current)",
     "The ampere (A) is the SI base unit of electric current, defined by fixing the elementary charge "
     "at exactly 1.602176634e-19 coulomb; one ampere is one coulomb per second."),
    ("unit-kelvin", "Kelvin (SI base unit of temperature)",
     "The kelvin (K) is the SI base unit of thermodynamic temperature, defined by fixing the Boltzmann "
     "constant at exactly 1.380649e-23 J/K. Absolute zero is 0 K; a temperature in degrees Celsius "
     "equals the temperature in kelvin minus 273.15."),
    ("unit-mole", "Mole (SI base unit of amount of substance)",
     "The mole (mol) is the SI base unit of amount of substance: exactly 6.02214076e23 elementary "
     "entities. The molar mass of a compound in grams per mole is numerically the sum of the standard "
     "atomic weights of its atoms."),
    ("unit-candela", "Candela (SI base unit of luminous intensity)",
     "The candela (cd) is the SI base unit of luminous intensity, defined by fixing the luminous efficacy "
     "of 540 THz monochromatic radiation at exactly 683 lumens per watt."),
    ("unit-newton", "Newton (unit of force)",
     "The newton (N) is the SI unit of force: the force that gives a mass of one kilogram an acceleration "
     "of one metre per second squared, 1 N = 1 kg m/s^2. The weight of a body is its mass times the "
     "gravitational acceleration. It is named after Isaac Newton."),
    ("unit-joule", "Joule (unit of energy)",
     "The joule (J) is the SI unit of energy, work and heat: the work done by a force of one newton "
     "acting over one metre, 1 J = 1 N m = 1 kg m^2/s^2."),
    ("unit-watt", "Watt (unit of power)",
     "The watt (W) is the SI unit of power, one joule per second. It is named after James Watt. One "
     "mechanical horsepower is about 745.7 watts."),
    ("unit-pascal", "Pascal (unit of pressure)",
     "The pascal (Pa) is the SI unit of pressure, one newton per square metre. One bar is 100,000 Pa and "
     "one standard atmosphere is 101,325 Pa."),
    ("unit-hertz", "Hertz (unit of frequency)",
     "The hertz (Hz) is the SI unit of frequency, one cycle per second. It is named after Heinrich Hertz."),
    ("unit-coulomb", "Coulomb (unit of electric charge)",
     "The coulomb (C) is the SI unit of electric charge, the charge carried by a current of one ampere "
     "in one second; it is about 6.241509e18 elementary charges."),
    ("unit-volt", "Volt (unit of electric potential)",
     "The volt (V) is the SI unit of electric potential difference and electromotive force, one joule "
     "per coulomb. It is named after Alessandro Volta, inventor of the voltaic pile (1800)."),
    ("unit-ohm", "Ohm (unit of electrical resistance)",
     "The ohm (Ω) is the SI unit of electrical resistance, one volt per ampere. Ohm's law states that the "
     "current through a conductor is proportional to the voltage across it: V = I R."),
    ("unit-farad", "Farad (unit of capacitance)",
     "The farad (F) is the SI unit of capacitance, one coulomb per volt."),
    ("unit-henry", "Henry (unit of inductance)",
     "The henry (H) is the SI unit of inductance, one weber per ampere. It is named after Joseph Henry."),
    ("unit-tesla", "Tesla (unit of magnetic flux density)",
     "The tesla (T) is the SI unit of magnetic flux density (magnetic field strength B), one weber per "
     "square metre. It is named after Nikola Tesla. The Earth's magnetic field at the surface is about "
     "25 to 65 microtesla."),
    ("unit-weber", "Weber (unit of magnetic flux)",
     "The weber (Wb) is the SI unit of magnetic flux, one volt second. It is named after Wilhelm Weber."),
    ("unit-siemens", "Siemens (unit of electrical conductance)",
     "The siemens (S) is the SI unit of electrical conductance, the reciprocal of the ohm."),
    ("unit-becquerel", "Becquerel (unit of radioactivity)",
     "The becquerel (Bq) is the SI unit of radioactivity: one nuclear decay per second. It is named after "
     "Henri Becquerel, who discovered radioactivity in 1896."),
    ("unit-gray-sievert", "Gray and sievert (units of radiation dose)",
     "The gray (Gy) is the SI unit of absorbed radiation dose, one joule of energy absorbed per kilogram. "
     "The sievert (Sv) measures equivalent dose, weighted for the biological effect of the radiation."),
    ("unit-lumen-lux", "Lumen and lux (units of light)",
     "The lumen (lm) is the SI unit of luminous flux, one candela steradian; the lux (lx) is the unit of "
     "illuminance, one lumen per square metre."),
    ("unit-katal", "Katal (unit of catalytic activity)",
     "The katal (kat) is the SI unit of catalytic activity, one mole per second."),
    ("unit-radian", "Radian and steradian",
     "The radian (rad) is the SI unit of plane angle: a full circle is 2π radians, so one radian is about "
     "57.2958 degrees. The steradian (sr) is the unit of solid angle; a sphere subtends 4π steradians."),
    ("unit-prefixes-large", "SI prefixes for large multiples",
     "SI prefixes for multiples: deca (da) 10^1, hecto (h) 10^2, kilo (k) 10^3, mega (M) 10^6, giga (G) "
     "10^9, tera (T) 10^12, peta (P) 10^15, exa (E) 10^18, zetta (Z) 10^21, yotta (Y) 10^24, ronna (R) "
     "10^27 and quetta (Q) 10^30; ronna and quetta were added in 2022."),
    ("unit-prefixes-small", "SI prefixes for small fractions",
     "SI prefixes for fractions: deci (d) 10^-1, centi (c) 10^-2, milli (m) 10^-3, micro (μ) 10^-6, nano "
     "(n) 10^-9, pico (p) 10^-12, femto (f) 10^-15, atto (a) 10^-18, zepto (z) 10^-21, yocto (y) 10^-24, "
     "ronto (r) 10^-27 and quecto (q) 10^-30."),
    ("unit-calorie", "Calorie",
     "The thermochemical calorie (cal) is exactly 4.184 joules, about the energy needed to warm one gram "
     "of water by one degree Celsius. The food Calorie (kcal) is 1,000 calories."),
    ("unit-imperial-length", "Inch, foot, yard and mile",
     "Since the international yard and pound agreement of 1959, one inch is exactly 2.54 centimetres, one "
     "foot (12 inches) is exactly 0.3048 metres, one yard is 0.9144 metres and one international mile "
     "(5,280 feet) is exactly 1,609.344 metres."),
    ("unit-pound", "Pound (mass)",
     "The international avoirdupois pound (lb) is defined as exactly 0.45359237 kilograms; one pound is "
     "16 ounces."),
    ("unit-nautical-mile", "Nautical mile and knot",
     "The international nautical mile is exactly 1,852 metres. A knot is a speed of one nautical mile per "
     "hour, about 0.514 m/s."),
    ("unit-angstrom", "Ångström",
     "The ångström (Å) is a unit of length equal to 10^-10 metres (0.1 nanometre), used for atomic sizes "
     "and chemical bond lengths. It is named after Anders Jonas Ångström."),
    ("unit-litre", "Litre",
     "The litre (L) is a unit of volume equal to one cubic decimetre, 0.001 cubic metres."),
    ("unit-temperature-scales", "Celsius and Fahrenheit temperature scales",
     "A temperature in degrees Fahrenheit is F = 9/5 C + 32, where C is the temperature in degrees "
     "Celsius. Water freezes at 32 °F (0 °C) and boils at 212 °F (100 °C) at standard pressure."),
    ("unit-torr", "Torr and millimetre of mercury",
     "The torr is 1/760 of a standard atmosphere, about 133.322 pascals, very nearly the pressure of a "
     "one-millimetre column of mercury."),
)

CHEMISTRY: tuple[tuple[str, str, str], ...] = (
    ("chem-ideal-gas-law", "Ideal gas law",
     "The ideal gas law p V = n R T relates the pressure p, volume V, amount of substance n and absolute "
     "temperature T of an ideal gas through the molar gas constant R, about 8.314 J/(mol K). It was "
     "first stated by Émile Clapeyron in 1834."),
    ("chem-ph", "pH",
     "pH is the negative base-10 logarithm of the hydrogen ion activity in a solution, "
     "pH = −log10[H+]. Pure water at 25 °C has pH 7; acids have pH below 7 and bases above 7."),
    ("chem-periodic-table", "Periodic table",
     "The periodic table arranges the chemical elements by atomic number in rows (periods) and columns "
     "(groups) of similar chemistry. Dmitri Mendeleev published his periodic table in 1869 and left gaps "
     "for undiscovered elements such as gallium and germanium. The modern table has 118 elements in 7 "
     "periods and 18 groups."),
    ("chem-avogadro-law", "Avogadro's law",
     "Avogadro's law (1811) states that equal volumes of gases at the same temperature and pressure "
     "contain equal numbers of molecules. One mole of an ideal gas occupies about 22.414 litres at "
     "0 °C and one standard atmosphere."),
    ("chem-boyle-law", "Boyle's law",
     "Boyle's law (Robert Boyle, 1662) states that at constant temperature the pressure of a fixed amount "
     "of gas is inversely proportional to its volume: p1 V1 = p2 V2."),
    ("chem-charles-law", "Charles's law",
     "Charles's law states that at constant pressure the volume of a gas is proportional to its absolute "
     "temperature: V1 / T1 = V2 / T2."),
    ("chem-water-properties", "Properties of water",
     "At a pressure of one standard atmosphere pure water freezes at 0 °C and boils at about 99.97 °C "
     "(100 °C on the old definition). The triple point of water is 273.16 K at 611.657 Pa. Liquid water "
     "is densest, about 999.97 kg/m^3, at about 4 °C. Its specific heat capacity is about 4.18 J/(g K)."),
    ("chem-half-life", "Half-life",
     "The half-life of a radioactive isotope is the time in which half of its nuclei decay. After n "
     "half-lives a fraction (1/2)^n remains. Carbon-14 has a half-life of about 5,730 years, used in "
     "radiocarbon dating; uranium-238 about 4.47 billion years."),
    ("chem-covalent-bond", "Covalent bond",
     "A covalent bond is a chemical bond formed by the sharing of electron pairs between atoms. Gilbert "
     "N. Lewis described the shared-pair bond in 1916."),
    ("chem-ionic-bond", "Ionic bond",
     "An ionic bond is the electrostatic attraction between oppositely charged ions, formed when one atom "
     "transfers electrons to another, as in sodium chloride (Na+ Cl−)."),
    ("chem-electronegativity", "Electronegativity",
     "Electronegativity is the tendency of an atom to attract shared electrons. On the Pauling scale "
     "fluorine is the most electronegative element (3.98) and caesium and francium among the least "
     "(about 0.7 to 0.8)."),
    ("chem-catalyst", "Catalyst",
     "A catalyst increases the rate of a chemical reaction without being consumed, by lowering its "
     "activation energy. Enzymes are biological catalysts. The Haber process uses an iron catalyst to "
     "make ammonia from nitrogen and hydrogen."),
    ("chem-haber", "Haber–Bosch process",
     "The Haber–Bosch process synthesizes ammonia from nitrogen and hydrogen (N2 + 3 H2 → 2 NH3) over an "
     "iron catalyst at about 400 to 500 °C and 150 to 300 bar. Fritz Haber developed it around 1909 and "
     "Carl Bosch industrialized it."),
    ("chem-combustion-methane", "Combustion of methane",
     "Methane burns in oxygen to carbon dioxide and water: CH4 + 2 O2 → CO2 + 2 H2O, releasing about "
     "890 kJ per mole of methane (standard enthalpy of combustion)."),
    ("chem-isotope", "Isotope",
     "Isotopes are atoms of the same element (same number of protons) with different numbers of "
     "neutrons. Hydrogen has three natural isotopes: protium, deuterium and tritium; tritium is radioactive."),
    ("chem-noble-gas", "Noble gases",
     "The noble gases of group 18, helium, neon, argon, krypton, xenon and radon, are colourless, "
     "odourless monatomic gases with full valence shells and very low chemical reactivity. Argon makes up "
     "about 0.93 percent of the Earth's atmosphere."),
    ("chem-atmosphere", "Composition of Earth's atmosphere",
     "Dry air is about 78.08 percent nitrogen, 20.95 percent oxygen and 0.93 percent argon by volume, with "
     "about 0.04 percent carbon dioxide and traces of other gases."),
)

#: (id, name, formula, counts of atoms by element symbol, description)
COMPOUNDS: tuple[tuple[str, str, str, dict[str, int], str], ...] = (
    ("water", "Water", "H2O", {"H": 2, "O": 1},
     "Each water molecule has two hydrogen atoms bonded to one oxygen atom at an angle of about 104.5 degrees."),
    ("carbon-dioxide", "Carbon dioxide", "CO2", {"C": 1, "O": 2},
     "A linear molecule; a greenhouse gas produced by respiration and combustion, and taken up by photosynthesis."),
    ("methane", "Methane", "CH4", {"C": 1, "H": 4},
     "The simplest alkane and the main component of natural gas; a tetrahedral molecule."),
    ("ammonia", "Ammonia", "NH3", {"N": 1, "H": 3},
     "A pungent gas made industrially by the Haber–Bosch process, mainly for fertilisers."),
    ("sodium-chloride", "Sodium chloride", "NaCl", {"Na": 1, "Cl": 1},
     "Common table salt, an ionic compound crystallizing in a cubic lattice."),
    ("glucose", "Glucose", "C6H12O6", {"C": 6, "H": 12, "O": 6},
     "A simple sugar (monosaccharide) made by plants in photosynthesis and the main energy source of cells."),
    ("ethanol", "Ethanol", "C2H5OH", {"C": 2, "H": 6, "O": 1},
     "The alcohol of alcoholic drinks, made by yeast fermentation of sugars; it boils at 78.37 °C."),
    ("sulfuric-acid", "Sulfuric acid", "H2SO4", {"H": 2, "S": 1, "O": 4},
     "A strong mineral acid and one of the most produced industrial chemicals, made by the contact process."),
    ("calcium-carbonate", "Calcium carbonate", "CaCO3", {"Ca": 1, "C": 1, "O": 3},
     "The main component of limestone, marble, chalk and seashells."),
    ("benzene", "Benzene", "C6H6", {"C": 6, "H": 6},
     "An aromatic hydrocarbon whose six carbon atoms form a planar ring; its ring structure was proposed "
     "by August Kekulé in 1865."),
    ("ozone", "Ozone", "O3", {"O": 3},
     "A form of oxygen with three atoms per molecule; the stratospheric ozone layer absorbs most of the "
     "Sun's ultraviolet radiation."),
    ("hydrogen-peroxide", "Hydrogen peroxide", "H2O2", {"H": 2, "O": 2},
     "A pale blue liquid used as a bleach and disinfectant; it decomposes into water and oxygen."),
    ("nitric-acid", "Nitric acid", "HNO3", {"H": 1, "N": 1, "O": 3},
     "A strong acid made by the Ostwald process from ammonia."),
    ("acetic-acid", "Acetic acid", "CH3COOH", {"C": 2, "H": 4, "O": 2},
     "The acid of vinegar, a weak carboxylic acid."),
    ("sodium-bicarbonate", "Sodium bicarbonate", "NaHCO3", {"Na": 1, "H": 1, "C": 1, "O": 3},
     "Baking soda; it releases carbon dioxide when heated or mixed with an acid."),
    ("propane", "Propane", "C3H8", {"C": 3, "H": 8},
     "A three-carbon alkane used as a fuel gas (liquefied petroleum gas)."),
    ("caffeine", "Caffeine", "C8H10N4O2", {"C": 8, "H": 10, "N": 4, "O": 2},
     "A stimulant alkaloid found in coffee beans and tea leaves."),
    ("aspirin", "Aspirin (acetylsalicylic acid)", "C9H8O4", {"C": 9, "H": 8, "O": 4},
     "A pain reliever and anti-inflammatory drug first synthesized in a pure, stable form at Bayer in 1897."),
    ("iron-oxide", "Iron(III) oxide", "Fe2O3", {"Fe": 2, "O": 3},
     "The main component of rust and of the iron ore hematite."),
    ("silicon-dioxide", "Silicon dioxide", "SiO2", {"Si": 1, "O": 2},
     "Silica, the main component of quartz and of most sand."),
)

BIOLOGY: tuple[tuple[str, str, str], ...] = (
    ("bio-dna", "DNA",
     "Deoxyribonucleic acid (DNA) carries the genetic instructions of living organisms. It is a double "
     "helix of two strands built from four nucleotide bases: adenine (A), thymine (T), guanine (G) and "
     "cytosine (C). Adenine pairs with thymine and guanine with cytosine. James Watson and Francis Crick "
     "proposed the double-helix structure in 1953, using X-ray diffraction data of Rosalind Franklin."),
    ("bio-rna", "RNA",
     "Ribonucleic acid (RNA) is usually single-stranded and uses the sugar ribose. In RNA the base uracil "
     "(U) takes the place of thymine. Messenger RNA carries genetic information from DNA to the ribosomes."),
    ("bio-genetic-code", "Genetic code",
     "The genetic code maps the 64 possible codons (triplets of RNA bases) to 20 standard amino acids and "
     "stop signals. AUG codes for methionine and is the usual start codon; UAA, UAG and UGA are stop "
     "codons. The code is nearly universal across life."),
    ("bio-human-chromosomes", "Human chromosomes",
     "Human body cells normally have 46 chromosomes in 23 pairs: 22 pairs of autosomes and one pair of "
     "sex chromosomes (XX in females, XY in males). Egg and sperm cells have 23."),
    ("bio-human-genome", "Human genome",
     "The human genome contains about 3.1 billion base pairs of DNA in each set of chromosomes and about "
     "20,000 protein-coding genes. The Human Genome Project declared it essentially complete in 2003."),
    ("bio-skeleton", "Human skeleton",
     "The adult human skeleton has 206 bones; a newborn has around 270, some of which fuse during growth. "
     "The femur (thigh bone) is the longest and strongest bone; the stapes in the middle ear is the smallest."),
    ("bio-heart", "Human heart",
     "The human heart has four chambers: two atria and two ventricles. The right side pumps blood to the "
     "lungs and the left side to the rest of the body. At rest it beats about 60 to 100 times a minute."),
    ("bio-blood-types", "ABO blood group system",
     "Karl Landsteiner discovered the ABO blood groups in 1901. The four types A, B, AB and O depend on "
     "antigens on red blood cells. Type O negative donors can give red cells to any recipient; AB positive "
     "recipients can receive from any type."),
    ("bio-red-blood-cell", "Red blood cell",
     "Red blood cells (erythrocytes) carry oxygen bound to haemoglobin, a protein of four subunits each "
     "holding an iron-containing haem group. Mature human red cells have no nucleus and live about 120 days."),
    ("bio-mitochondrion", "Mitochondrion",
     "Mitochondria are the organelles that produce most of a cell's ATP by aerobic respiration; they are "
     "often called the powerhouse of the cell. They have their own small circular DNA, inherited from "
     "the mother."),
    ("bio-ribosome", "Ribosome",
     "Ribosomes are the molecular machines that translate messenger RNA into protein. They are made of "
     "ribosomal RNA and proteins; bacterial ribosomes are 70S and eukaryotic ones 80S."),
    ("bio-chloroplast", "Chloroplast",
     "Chloroplasts are the organelles of plants and algae in which photosynthesis takes place. They "
     "contain chlorophyll, which absorbs mainly blue and red light and reflects green."),
    ("bio-photosynthesis", "Photosynthesis",
     "Photosynthesis converts light energy into chemical energy. Overall, 6 CO2 + 6 H2O → C6H12O6 + 6 O2: "
     "carbon dioxide and water become glucose and oxygen. The oxygen released comes from the water."),
    ("bio-cellular-respiration", "Cellular respiration",
     "Aerobic cellular respiration oxidizes glucose to carbon dioxide and water, C6H12O6 + 6 O2 → 6 CO2 + "
     "6 H2O, storing energy as ATP: about 30 to 32 ATP per glucose molecule, through glycolysis, the "
     "citric acid cycle and oxidative phosphorylation."),
    ("bio-atp", "Adenosine triphosphate",
     "Adenosine triphosphate (ATP) is the main energy carrier of cells. Hydrolysis of ATP to ADP and "
     "phosphate releases about 30.5 kJ/mol under standard conditions."),
    ("bio-cell-theory", "Cell theory",
     "Cell theory, formulated by Matthias Schleiden (1838) and Theodor Schwann (1839) and completed by "
     "Rudolf Virchow (1855), states that all living things are made of cells, that the cell is the basic "
     "unit of life, and that all cells arise from pre-existing cells."),
    ("bio-evolution", "Evolution by natural selection",
     "Charles Darwin and Alfred Russel Wallace proposed evolution by natural selection in 1858. Darwin's "
     "book On the Origin of Species was published on 24 November 1859."),
    ("bio-linnaeus", "Binomial nomenclature",
     "Carl Linnaeus established the two-part naming of species (genus and species, as in Homo sapiens) in "
     "Systema Naturae (1735) and Species Plantarum (1753)."),
    ("bio-insulin", "Insulin",
     "Insulin is a peptide hormone made by the beta cells of the pancreatic islets that lowers blood "
     "glucose. Human insulin has 51 amino acids in two chains. Frederick Banting and Charles Best "
     "isolated it in 1921."),
    ("bio-neuron", "Neuron",
     "Neurons are the electrically excitable cells of the nervous system. They transmit signals as action "
     "potentials along the axon and pass them to other cells at synapses. The human brain has about 86 "
     "billion neurons."),
    ("bio-skin", "Skin",
     "The skin is the largest organ of the human body, with an area of about 1.5 to 2 square metres in "
     "adults. Its layers are the epidermis, the dermis and the subcutaneous tissue."),
    ("bio-body-temperature", "Human body temperature",
     "Normal human core body temperature is about 37 °C (98.6 °F), though it varies between individuals "
     "and over the day by about half a degree."),
    ("bio-virus", "Virus",
     "Viruses are infectious agents that replicate only inside living cells. A virus particle (virion) "
     "has genetic material, DNA or RNA, in a protein coat called a capsid. Bacteriophages infect bacteria."),
    ("bio-crispr", "CRISPR gene editing",
     "CRISPR–Cas9 is a gene-editing tool adapted from a bacterial immune system. Jennifer Doudna and "
     "Emmanuelle Charpentier described its use for programmable DNA cutting in 2012 and received the 2020 "
     "Nobel Prize in Chemistry."),
    ("bio-enzyme", "Enzyme",
     "Enzymes are proteins (and some RNAs) that catalyse biochemical reactions. Most human enzymes work "
     "best near 37 °C; pepsin in the stomach works best at an acidic pH of about 2."),
    ("bio-blue-whale", "Blue whale",
     "The blue whale (Balaenoptera musculus) is the largest animal known to have lived, reaching about "
     "30 metres in length and up to about 190 tonnes."),
    ("bio-tardigrade", "Tardigrade",
     "Tardigrades (water bears) are microscopic eight-legged animals, about 0.5 mm long, that survive "
     "extreme cold, drying, radiation and even the vacuum of space in a dormant state."),
    ("bio-sequoia", "Giant sequoia and coast redwood",
     "The coast redwood (Sequoia sempervirens) is the tallest tree species; the tallest known specimen, "
     "Hyperion, is about 116 metres tall. The giant sequoia (Sequoiadendron giganteum) is the largest tree "
     "by volume."),
)

GEOGRAPHY: tuple[tuple[str, str, str], ...] = (
    ("geo-everest", "Mount Everest",
     "Mount Everest, on the border of Nepal and China in the Himalayas, is the highest mountain above sea "
     "level. A joint Chinese-Nepalese survey in 2020 measured its height as 8,848.86 metres (8,849 m). "
     "Edmund Hillary and Tenzing Norgay first reached the summit on 29 May 1953."),
    ("geo-k2", "K2",
     "K2, on the border of Pakistan and China in the Karakoram range, is the second-highest mountain on "
     "Earth at 8,611 metres. It was first climbed in 1954 by an Italian expedition."),
    ("geo-kangchenjunga", "Kangchenjunga",
     "Kangchenjunga, on the border of Nepal and India, is the third-highest mountain in the world at "
     "8,586 metres."),
    ("geo-aconcagua", "Aconcagua",
     "Aconcagua in the Andes of Argentina, 6,961 metres high, is the highest mountain outside Asia and "
     "the highest in the Western and Southern Hemispheres."),
    ("geo-kilimanjaro", "Mount Kilimanjaro",
     "Mount Kilimanjaro in Tanzania is a dormant volcano and the highest mountain in Africa, at 5,895 metres."),
    ("geo-denali", "Denali",
     "Denali in Alaska is the highest mountain in North America, at 6,190 metres."),
    ("geo-mont-blanc", "Mont Blanc",
     "Mont Blanc, on the border of France and Italy, is the highest mountain in the Alps, about 4,806 "
     "metres high (its snow cap varies)."),
    ("geo-mariana-trench", "Mariana Trench",
     "The Mariana Trench in the western Pacific Ocean is the deepest oceanic trench. Its deepest point, "
     "the Challenger Deep, lies about 10,900 metres below sea level. Jacques Piccard and Don Walsh "
     "reached it in the bathyscaphe Trieste in 1960."),
    ("geo-nile", "Nile",
     "The Nile in northeastern Africa, about 6,650 km long, is usually regarded as the longest river in "
     "the world. It flows north into the Mediterranean Sea; its main tributaries are the White Nile and "
     "the Blue Nile, which meet at Khartoum."),
    ("geo-amazon", "Amazon River",
     "The Amazon in South America, about 6,400 km long, is the largest river in the world by discharge, "
     "about 209,000 cubic metres per second on average, more than the next seven largest rivers combined."),
    ("geo-yangtze", "Yangtze",
     "The Yangtze, about 6,300 km long, is the longest river in Asia and the longest flowing entirely "
     "within one country, China. The Three Gorges Dam spans it."),
    ("geo-mississippi", "Mississippi River",
     "The Mississippi River flows about 3,730 km from Lake Itasca in Minnesota to the Gulf of Mexico; "
     "with the Missouri it forms the largest river system in North America."),
    ("geo-pacific", "Pacific Ocean",
     "The Pacific Ocean is the largest and deepest ocean, covering about 165 million square kilometres, "
     "about a third of the Earth's surface. Ferdinand Magellan named it the peaceful sea in 1520."),
    ("geo-atlantic", "Atlantic Ocean",
     "The Atlantic Ocean is the second-largest ocean, covering about 106 million square kilometres between "
     "the Americas and Europe and Africa."),
    ("geo-indian-ocean", "Indian Ocean",
     "The Indian Ocean is the third-largest ocean, covering about 70.6 million square kilometres."),
    ("geo-arctic-ocean", "Arctic Ocean",
     "The Arctic Ocean, around the North Pole, is the smallest and shallowest of the five oceans, covering "
     "about 14 million square kilometres."),
    ("geo-continents", "Continents by area",
     "The seven continents by area: Asia about 44.6 million square kilometres, Africa 30.4 million, North "
     "America 24.7 million, South America 17.8 million, Antarctica 14.2 million, Europe 10.2 million and "
     "Australia (Oceania) 8.6 million."),
    ("geo-sahara", "Sahara",
     "The Sahara in North Africa is the largest hot desert in the world, about 9.2 million square "
     "kilometres. Antarctica is the largest desert overall."),
    ("geo-atacama", "Atacama Desert",
     "The Atacama Desert in northern Chile is the driest non-polar desert in the world; some weather "
     "stations there have never recorded rain."),
    ("geo-dead-sea", "Dead Sea",
     "The Dead Sea, a salt lake between Jordan and Israel, has the lowest land elevation on Earth, about "
     "430 metres below sea level, and a salinity of about 34 percent."),
    ("geo-baikal", "Lake Baikal",
     "Lake Baikal in Siberia, Russia, is the deepest lake in the world, with a maximum depth of 1,642 "
     "metres, and the oldest, about 25 million years. It holds about 22 to 23 percent of the world's fresh "
     "surface water."),
    ("geo-caspian", "Caspian Sea",
     "The Caspian Sea, between Europe and Asia, is the largest lake on Earth by area, about 371,000 square "
     "kilometres; its water is brackish."),
    ("geo-superior", "Lake Superior",
     "Lake Superior, the largest of the Great Lakes of North America, is the largest freshwater lake in "
     "the world by surface area, about 82,100 square kilometres."),
    ("geo-angel-falls", "Angel Falls",
     "Angel Falls in Venezuela is the highest uninterrupted waterfall in the world, with a height of 979 "
     "metres and a plunge of 807 metres."),
    ("geo-greenland", "Greenland",
     "Greenland is the largest island in the world that is not a continent, about 2.17 million square "
     "kilometres, most of it covered by an ice sheet."),
    ("geo-earth-shape", "Figure of the Earth",
     "The Earth is an oblate spheroid. In the WGS 84 reference ellipsoid its equatorial radius is "
     "6,378.137 km and its polar radius about 6,356.752 km; its mean radius is about 6,371 km and its "
     "equatorial circumference about 40,075 km."),
    ("geo-tropics", "Tropics and polar circles",
     "The Tropic of Cancer and the Tropic of Capricorn lie at about 23.44 degrees north and south of the "
     "equator, equal to the tilt of the Earth's axis; the Arctic and Antarctic Circles at about 66.56 degrees."),
    ("geo-prime-meridian", "Prime meridian",
     "The prime meridian, longitude 0 degrees, passes through the Royal Observatory at Greenwich, London, "
     "as agreed at the International Meridian Conference in 1884."),
    ("geo-russia", "Russia",
     "Russia is the largest country in the world by area, about 17.1 million square kilometres, spanning "
     "eleven time zones across Eastern Europe and northern Asia. Its capital is Moscow."),
    ("geo-vatican", "Vatican City",
     "Vatican City, an enclave within Rome, is the smallest independent state in the world, with an area "
     "of about 0.44 square kilometres."),
    ("geo-equator", "Equator",
     "The equator is the circle of latitude 0 degrees, dividing the Earth into the Northern and Southern "
     "Hemispheres. It passes through 13 countries, among them Ecuador, Colombia, Brazil, Kenya and Indonesia."),
    ("geo-great-barrier-reef", "Great Barrier Reef",
     "The Great Barrier Reef off Queensland, Australia, is the world's largest coral reef system, "
     "stretching over 2,300 km."),
)
