#pragma once
// make_corpus: a deterministic English-like training text that loom writes itself, so
// examples and tests train on real-looking language without downloads or copied text.
//
// The text is drawn from hand-written templates with a splitmix64 generator implemented
// here: only 64-bit integer arithmetic, no std::*_distribution (whose output differs between
// standard libraries), so a given (bytes, seed) yields the same string on every platform.
// It has structure a small model can learn quickly:
//   - fixed facts that recur ("A spider has eight legs.", "The baker works at the bakery."),
//   - arithmetic that is always right ("Three plus four is seven.", "12 + 7 = 19."),
//   - short stories whose counts add up ("... bought five red apples. ... so now she has
//     seven apples."), dialogue with quotes, and paragraphs separated by a blank line.
// Laws: make_corpus(n, s).size() == n; make_corpus(n, s) is a prefix of make_corpus(m, s)
// for n <= m (the text is generated in order, then cut to length).
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <loom/core/linkage.hpp>
#include <loom/core/random.hpp>

namespace loom::train {

namespace detail {

// splitmix64: a 64-bit counter passed through a bijective mixer. Small, fast and fully
// specified, which is what cross-platform determinism needs.
class corpus_rng {
public:
    explicit constexpr corpus_rng(std::uint64_t seed) noexcept : state_(seed) {}

    constexpr std::uint64_t next() noexcept {
        return finalize_mix(state_ += golden_gamma);
    }

    // Uniform on [0, n) up to a bias below n / 2^64, invisible for the small n used here.
    constexpr std::size_t below(std::size_t n) noexcept { return static_cast<std::size_t>(next() % n); }

    // Uniform on [lo, hi].
    constexpr int between(int lo, int hi) noexcept { return lo + static_cast<int>(below(static_cast<std::size_t>(hi - lo + 1))); }

    constexpr bool percent(int p) noexcept { return below(100) < static_cast<std::size_t>(p); }

    template <class T, std::size_t N>
    constexpr const T& pick(const std::array<T, N>& items) noexcept {
        return items[below(N)];
    }

private:
    std::uint64_t state_;
};

struct corpus_person {
    std::string_view name, subject, object, possessive;
};

struct corpus_animal {
    std::string_view singular, plural;
    int legs;
    std::string_view sound;  // empty: the animal makes no sound worth a sentence
    std::string_view home, food;
};

struct corpus_job {
    std::string_view title, workplace, duty;
};

struct corpus_pair {
    std::string_view first, second;
};

inline constexpr std::array<corpus_person, 30> corpus_people{{
    {"Anna", "she", "her", "her"},   {"Ben", "he", "him", "his"},     {"Clara", "she", "her", "her"},
    {"David", "he", "him", "his"},   {"Emma", "she", "her", "her"},   {"Felix", "he", "him", "his"},
    {"Grace", "she", "her", "her"},  {"Hugo", "he", "him", "his"},    {"Iris", "she", "her", "her"},
    {"Jack", "he", "him", "his"},    {"Kate", "she", "her", "her"},   {"Leo", "he", "him", "his"},
    {"Maya", "she", "her", "her"},   {"Noah", "he", "him", "his"},    {"Olga", "she", "her", "her"},
    {"Peter", "he", "him", "his"},   {"Rosa", "she", "her", "her"},   {"Sam", "he", "him", "his"},
    {"Tara", "she", "her", "her"},   {"Omar", "he", "him", "his"},    {"Vera", "she", "her", "her"},
    {"Will", "he", "him", "his"},    {"Yara", "she", "her", "her"},   {"Zeno", "he", "him", "his"},
    {"Lucy", "she", "her", "her"},   {"Mark", "he", "him", "his"},    {"Nina", "she", "her", "her"},
    {"Paul", "he", "him", "his"},    {"Ruth", "she", "her", "her"},   {"Tom", "he", "him", "his"},
}};

inline constexpr std::array<std::string_view, 8> corpus_towns{
    "Ashby", "Brindle", "Carrow", "Dunmore", "Elmstead", "Fernley", "Glenmoor", "Hollins"};

inline constexpr std::array<std::string_view, 12> corpus_colours{
    "red", "blue", "green", "yellow", "white", "black", "brown", "orange", "purple", "pink", "grey", "silver"};

// Small things; plurals follow corpus_plural's rules.
inline constexpr std::array<std::string_view, 40> corpus_objects{
    "ball",   "cup",    "book",   "box",    "hat",     "key",     "lamp",   "pen",    "spoon",  "bowl",
    "bottle", "bag",    "coat",   "shoe",   "clock",   "plate",   "basket", "candle", "kite",   "drum",
    "bell",   "brush",  "ring",   "mirror", "pillow",  "blanket", "map",    "letter", "jar",    "bucket",
    "ladder", "rope",   "coin",   "stone",  "shell",   "feather", "ribbon", "button", "glass",  "sock"};

inline constexpr std::array<std::string_view, 12> corpus_surfaces{
    "table", "shelf", "desk", "bed", "sofa", "chair", "bench", "stool", "cupboard", "counter", "windowsill", "floor"};

inline constexpr std::array<std::string_view, 7> corpus_prepositions{
    "on", "under", "next to", "behind", "in front of", "near", "beside"};

inline constexpr std::array<std::string_view, 28> corpus_places{
    "kitchen", "garden",  "park",   "market", "school",   "library", "station",  "harbour", "forest", "village",
    "river",   "hill",    "beach",  "farm",   "bakery",   "museum",  "bridge",   "square",  "field",  "lake",
    "castle",  "tower",   "shop",   "cafe",   "hospital", "zoo",     "workshop", "island"};

inline constexpr std::array<std::string_view, 20> corpus_fruit_and_snacks{
    "apple", "pear",  "plum",  "bun",  "cake", "egg",   "carrot",  "onion", "lemon",  "grape",
    "melon", "cherry", "nut",  "bean", "pie",  "peach", "biscuit", "fig",   "cookie", "sandwich"};

inline constexpr std::array<std::string_view, 12> corpus_meals{
    "bread", "cheese", "soup", "rice", "honey", "milk", "tea", "butter", "jam", "porridge", "juice", "water"};

inline constexpr std::array<corpus_animal, 22> corpus_animals{{
    {"cat", "cats", 4, "meow", "house", "fish"},
    {"dog", "dogs", 4, "woof", "house", "bones"},
    {"cow", "cows", 4, "moo", "field", "grass"},
    {"sheep", "sheep", 4, "baa", "meadow", "grass"},
    {"horse", "horses", 4, "neigh", "stable", "hay"},
    {"pig", "pigs", 4, "oink", "sty", "turnips"},
    {"duck", "ducks", 2, "quack", "pond", "seeds"},
    {"hen", "hens", 2, "cluck", "coop", "corn"},
    {"owl", "owls", 2, "hoot", "forest", "mice"},
    {"frog", "frogs", 4, "croak", "pond", "flies"},
    {"bee", "bees", 6, "buzz", "hive", "nectar"},
    {"lion", "lions", 4, "roar", "savanna", "meat"},
    {"mouse", "mice", 4, "squeak", "barn", "cheese"},
    {"goat", "goats", 4, "bleat", "mountain", "leaves"},
    {"fox", "foxes", 4, "yip", "den", "berries"},
    {"bear", "bears", 4, "growl", "cave", "honey"},
    {"spider", "spiders", 8, "", "web", "flies"},
    {"ant", "ants", 6, "", "nest", "crumbs"},
    {"crow", "crows", 2, "caw", "tree", "worms"},
    {"snake", "snakes", 0, "hiss", "desert", "eggs"},
    {"wolf", "wolves", 4, "howl", "forest", "meat"},
    {"goose", "geese", 2, "honk", "lake", "grass"},
}};

inline constexpr std::array<corpus_job, 18> corpus_jobs{{
    {"baker", "bakery", "bakes bread"},
    {"farmer", "farm", "grows wheat"},
    {"teacher", "school", "teaches children"},
    {"doctor", "hospital", "helps sick people"},
    {"sailor", "harbour", "sails a boat"},
    {"painter", "workshop", "paints pictures"},
    {"builder", "building site", "builds houses"},
    {"driver", "bus station", "drives the bus"},
    {"librarian", "library", "lends books"},
    {"gardener", "park", "waters the flowers"},
    {"fisher", "lake", "catches fish"},
    {"cook", "cafe", "makes soup"},
    {"nurse", "hospital", "cares for patients"},
    {"pilot", "airport", "flies the plane"},
    {"shopkeeper", "shop", "sells sweets"},
    {"guard", "castle", "watches the gate"},
    {"miller", "mill", "grinds flour"},
    {"postman", "post office", "carries letters"},
}};

// (thing, its colour): facts that never change, so they are learnable.
inline constexpr std::array<corpus_pair, 20> corpus_colour_facts{{
    {"the sky", "blue"},          {"grass", "green"},        {"snow", "white"},      {"coal", "black"},
    {"the sun", "yellow"},        {"a ripe banana", "yellow"}, {"a ripe tomato", "red"}, {"a carrot", "orange"},
    {"milk", "white"},            {"the sea", "blue"},       {"a lemon", "yellow"},  {"a cherry", "red"},
    {"chocolate", "brown"},       {"an elephant", "grey"},   {"a frog", "green"},    {"a plum", "purple"},
    {"a flamingo", "pink"},       {"the night sky", "black"}, {"a leaf in summer", "green"},
    {"a leaf in autumn", "brown"},
}};

inline constexpr std::array<corpus_pair, 20> corpus_opposites{{
    {"hot", "cold"},   {"big", "small"},  {"tall", "short"}, {"old", "young"}, {"happy", "sad"},
    {"fast", "slow"},  {"open", "closed"}, {"full", "empty"}, {"light", "dark"}, {"up", "down"},
    {"left", "right"}, {"early", "late"}, {"wet", "dry"},    {"loud", "quiet"}, {"soft", "hard"},
    {"clean", "dirty"}, {"near", "far"},  {"strong", "weak"}, {"first", "last"}, {"day", "night"},
}};

inline constexpr std::array<std::string_view, 7> corpus_days{
    "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"};

inline constexpr std::array<std::string_view, 12> corpus_months{
    "January", "February", "March",     "April",   "May",      "June",
    "July",    "August",   "September", "October", "November", "December"};

// Season of each month, in month order (northern hemisphere).
inline constexpr std::array<std::string_view, 12> corpus_month_seasons{
    "winter", "winter", "spring", "spring", "spring", "summer",
    "summer", "summer", "autumn", "autumn", "autumn", "winter"};

inline constexpr std::array<std::string_view, 4> corpus_seasons{"spring", "summer", "autumn", "winter"};
inline constexpr std::array<std::string_view, 4> corpus_times{"morning", "afternoon", "evening", "night"};
inline constexpr std::array<std::string_view, 6> corpus_weather{"sunny", "rainy", "windy", "cloudy", "foggy", "snowy"};
inline constexpr std::array<std::string_view, 7> corpus_movements{
    "walked", "ran", "cycled", "drove", "went", "hurried", "wandered"};
inline constexpr std::array<std::string_view, 14> corpus_actions{
    "found", "bought", "counted", "collected", "picked", "carried", "washed",
    "painted", "wrapped", "sorted", "gathered", "packed", "saw", "kept"};
inline constexpr std::array<std::string_view, 14> corpus_adjectives{
    "big", "small", "old", "new", "heavy", "soft", "round", "shiny", "tiny", "long", "wooden", "broken", "clean", "pretty"};
inline constexpr std::array<std::string_view, 8> corpus_feelings{
    "happy", "tired", "sleepy", "hungry", "proud", "calm", "glad", "busy"};

inline constexpr std::array<std::string_view, 20> corpus_small_numbers{
    "zero",    "one",     "two",       "three",    "four",     "five",    "six",
    "seven",   "eight",   "nine",      "ten",      "eleven",   "twelve",  "thirteen",
    "fourteen", "fifteen", "sixteen",  "seventeen", "eighteen", "nineteen"};
inline constexpr std::array<std::string_view, 10> corpus_tens{
    "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"};

// 0..100 in words: 42 -> "forty-two", 100 -> "one hundred".
LOOM_INLINE std::string corpus_number(int n);

// box -> boxes, brush -> brushes, cherry -> cherries, cup -> cups.
LOOM_INLINE std::string corpus_plural(std::string_view noun);

// "<count> <noun>" with agreement: 1 -> "one apple", 3 -> "three apples".
inline std::string corpus_count(int count, std::string_view noun) {
    return corpus_number(count) + " " + (count == 1 ? std::string(noun) : corpus_plural(noun));
}

inline std::string corpus_article(std::string_view word) {
    return (std::string_view("aeiou").find(word.front()) != std::string_view::npos ? "an " : "a ") + std::string(word);
}

LOOM_INLINE std::string corpus_capitalized(std::string text);

class corpus_writer {
public:
    explicit corpus_writer(std::uint64_t seed) : rng_(seed) {}

    // Appends one paragraph followed by a blank line.
    void paragraph(std::string& out) {
        sentences_ = 0;
        const std::size_t kind = rng_.below(100);
        if (kind < 36) {
            story();
        } else if (kind < 66) {
            facts();
        } else if (kind < 86) {
            arithmetic();
        } else {
            scene();
        }
        out += text_;
        out += "\n\n";
        text_.clear();
    }

private:
    void say(std::string sentence) {
        if (sentences_++ != 0) text_ += ' ';
        text_ += corpus_capitalized(std::move(sentence));
    }

    // Every draw goes into a named local before it is used: the operands of `+` are
    // unsequenced, so `a + rng_.pick(x) + rng_.pick(y)` could draw in a different order on
    // another compiler and change the text.

    // A person, a place and a count that the later sentences keep consistent.
    void story() {
        const corpus_person& hero = rng_.pick(corpus_people);
        const corpus_person* other = &rng_.pick(corpus_people);
        while (other->name == hero.name) other = &rng_.pick(corpus_people);
        const corpus_job& job = rng_.pick(corpus_jobs);
        const std::string name(hero.name), subject(hero.subject), friend_name(other->name);

        const std::string town(rng_.pick(corpus_towns));
        if (rng_.percent(50)) {
            say(name + " is " + corpus_article(job.title) + " who lives in " + town + ".");
        } else {
            say(name + " lives in " + town + " and works at the " + std::string(job.workplace) + ".");
        }
        if (rng_.percent(40)) say("Every day " + subject + " " + std::string(job.duty) + ".");
        if (rng_.percent(40)) {
            const std::string weather(rng_.pick(corpus_weather));
            const std::string time(rng_.pick(corpus_times));
            say("It was a " + weather + " " + time + ", so " + subject + " took " + std::string(hero.possessive) +
                (weather == "sunny" ? " hat." : " coat."));
        }
        const std::string day(rng_.pick(corpus_days));
        const std::string movement(rng_.pick(corpus_movements));
        const std::string place(rng_.pick(corpus_places));
        say("On " + day + " " + subject + " " + movement + " to the " + place + ".");

        const bool food = rng_.percent(50);
        const std::string_view item = food ? rng_.pick(corpus_fruit_and_snacks) : rng_.pick(corpus_objects);
        const std::string colour = food ? std::string() : std::string(rng_.pick(corpus_colours)) + " ";
        const std::string action(rng_.pick(corpus_actions));
        int count = rng_.between(2, 12);
        say("There " + subject + " " + action + " " + corpus_number(count) + " " + colour + corpus_plural(item) + ".");
        if (rng_.percent(50)) {
            const int more = rng_.between(1, 9);
            say(friend_name + " gave " + std::string(hero.object) + " " + corpus_number(more) + " more, so now " + subject +
                " has " + corpus_count(count + more, item) + ".");
            count += more;
        } else {
            const int given = rng_.between(1, count - 1);
            say(name + " gave " + corpus_number(given) + " to " + friend_name + ", so " + subject + " has " +
                corpus_count(count - given, item) + " left.");
            count -= given;
        }
        if (rng_.percent(35)) {
            say("How many " + corpus_plural(item) + " does " + name + " have? " + corpus_capitalized(subject) + " has " +
                corpus_number(count) + ".");
        }
        if (rng_.percent(45)) {
            const std::string object(rng_.pick(corpus_objects));
            const std::string preposition(rng_.pick(corpus_prepositions));
            const std::string surface(rng_.pick(corpus_surfaces));
            say("\"Where is my " + object + "?\" asked " + name + ". \"It is " + preposition + " the " + surface +
                ",\" said " + friend_name + ".");
        }
        if (rng_.percent(50)) {
            const std::string meal(rng_.pick(corpus_meals));
            say("In the evening " + subject + " went home and had some " + meal + ".");
        }
        const std::string feeling(rng_.pick(corpus_feelings));
        say(subject + " was " + feeling + ".");
    }

    void facts() {
        const int n = rng_.between(3, 6);
        const std::size_t topic = rng_.below(5);
        for (int i = 0; i < n; ++i) {
            switch (topic) {
                case 0: animal_fact(); break;
                case 1: colour_fact(); break;
                case 2: opposite_fact(); break;
                case 3: job_fact(); break;
                default: calendar_fact(); break;
            }
        }
    }

    void animal_fact() {
        const corpus_animal& a = rng_.pick(corpus_animals);
        const std::string one(a.singular), many(a.plural);
        switch (rng_.below(5)) {
            case 0:
                say(corpus_article(one) + " has " + (a.legs == 0 ? std::string("no") : corpus_number(a.legs)) + " legs.");
                break;
            case 1:
                if (!a.sound.empty()) {
                    say("The " + one + " says " + std::string(a.sound) + ".");
                } else {
                    say(corpus_article(one) + " makes no sound.");
                }
                break;
            case 2: say(corpus_article(one) + " lives in " + corpus_article(a.home) + "."); break;
            case 3: say(many + " like to eat " + std::string(a.food) + "."); break;
            default: {
                const int count = rng_.between(2, 5);
                say(corpus_number(count) + " " + many + " have " +
                    (a.legs == 0 ? std::string("no") : corpus_number(count * a.legs)) + " legs.");
                break;
            }
        }
    }

    void colour_fact() {
        const corpus_pair& fact = rng_.pick(corpus_colour_facts);
        const std::string thing(fact.first), colour(fact.second);
        if (rng_.percent(50)) {
            say("What colour is " + thing + "? " + corpus_capitalized(thing) + " is " + colour + ".");
        } else {
            say(thing + " is " + colour + ".");
        }
    }

    void opposite_fact() {
        const corpus_pair& pair = rng_.pick(corpus_opposites);
        const bool forward = rng_.percent(50);
        const std::string from(forward ? pair.first : pair.second), to(forward ? pair.second : pair.first);
        say("The opposite of " + from + " is " + to + ".");
    }

    void job_fact() {
        const corpus_job& job = rng_.pick(corpus_jobs);
        const std::string title(job.title), workplace(job.workplace);
        switch (rng_.below(3)) {
            case 0: say("The " + title + " works at the " + workplace + "."); break;
            case 1: say("The " + title + " " + std::string(job.duty) + "."); break;
            default: {
                const corpus_person& person = rng_.pick(corpus_people);
                say(std::string(person.name) + " is " + corpus_article(title) + ", so " + std::string(person.subject) +
                    " works at the " + workplace + ".");
                break;
            }
        }
    }

    void calendar_fact() {
        switch (rng_.below(4)) {
            case 0: {
                const std::size_t d = rng_.below(7);
                say("The day after " + std::string(corpus_days[d]) + " is " + std::string(corpus_days[(d + 1) % 7]) + ".");
                break;
            }
            case 1: {
                const std::size_t m = rng_.below(12);
                say("The month after " + std::string(corpus_months[m]) + " is " +
                    std::string(corpus_months[(m + 1) % 12]) + ".");
                break;
            }
            case 2: {
                const std::size_t m = rng_.below(12);
                say(std::string(corpus_months[m]) + " is in " + std::string(corpus_month_seasons[m]) + ".");
                break;
            }
            default: {
                const std::size_t s = rng_.below(4);
                say(std::string(corpus_seasons[(s + 1) % 4]) + " comes after " + std::string(corpus_seasons[s]) + ".");
                break;
            }
        }
    }

    void arithmetic() {
        const int n = rng_.between(3, 6);
        for (int i = 0; i < n; ++i) {
            switch (rng_.below(8)) {
                case 0: {
                    const int a = rng_.between(0, 10);
                    const int b = rng_.between(0, 10);
                    say(corpus_number(a) + " plus " + corpus_number(b) + " is " + corpus_number(a + b) + ".");
                    break;
                }
                case 1: {
                    const int a = rng_.between(1, 20);
                    const int b = rng_.between(0, a);
                    say(corpus_number(a) + " minus " + corpus_number(b) + " is " + corpus_number(a - b) + ".");
                    break;
                }
                case 2: {
                    const int a = rng_.between(1, 10);
                    const int b = rng_.between(1, 10);
                    say(corpus_number(a) + " times " + corpus_number(b) + " is " + corpus_number(a * b) + ".");
                    break;
                }
                case 3: {
                    const int a = rng_.between(0, 50);
                    const int b = rng_.between(0, 49);
                    say(std::to_string(a) + " + " + std::to_string(b) + " = " + std::to_string(a + b) + ".");
                    break;
                }
                case 4: {
                    const int a = rng_.between(1, 20);
                    const int b = rng_.between(0, a - 1);
                    if (rng_.percent(50)) {
                        say(corpus_number(a) + " is more than " + corpus_number(b) + ".");
                    } else {
                        say(corpus_number(b) + " is less than " + corpus_number(a) + ".");
                    }
                    break;
                }
                case 5: {
                    const int a = rng_.between(1, 10);
                    say("Half of " + corpus_number(2 * a) + " is " + corpus_number(a) + ".");
                    break;
                }
                case 6: {
                    const int from = rng_.between(1, 15);
                    const int length = rng_.between(3, 6);
                    std::string line = "Count from " + corpus_number(from) + " to " + corpus_number(from + length - 1) + ":";
                    for (int k = 0; k < length; ++k) line += (k == 0 ? " " : ", ") + corpus_number(from + k);
                    say(line + ".");
                    break;
                }
                default: {
                    const std::string_view item = rng_.pick(corpus_fruit_and_snacks);
                    const int have = rng_.between(2, 12);
                    const int eaten = rng_.between(1, have - 1);
                    say("If you have " + corpus_count(have, item) + " and eat " + corpus_number(eaten) + ", you have " +
                        corpus_count(have - eaten, item) + " left.");
                    break;
                }
            }
        }
    }

    // A room or place described object by object.
    void scene() {
        const std::string place(rng_.pick(corpus_places));
        const std::string adjective(rng_.pick(corpus_adjectives));
        const std::string colour(rng_.pick(corpus_colours));
        const std::string object(rng_.pick(corpus_objects));
        say("In the " + place + " there is " + corpus_article(adjective) + " " + colour + " " + object + ".");
        const std::string preposition(rng_.pick(corpus_prepositions));
        const std::string surface(rng_.pick(corpus_surfaces));
        say("The " + object + " is " + preposition + " the " + surface + ".");
        const std::string_view other = rng_.pick(corpus_objects);
        const int count = rng_.between(1, 9);
        say("Next to it " + std::string(count == 1 ? "there is " : "there are ") + corpus_count(count, other) + ".");
        if (rng_.percent(50)) {
            const std::string other_colour(rng_.pick(corpus_colours));
            say(std::string(count == 1 ? "It is " : "They are ") + other_colour + ".");
        }
        if (rng_.percent(50)) {
            const corpus_person& visitor = rng_.pick(corpus_people);
            const std::string action(rng_.pick(corpus_actions));
            say(std::string(visitor.name) + " " + action + " the " + object + " and put it in " +
                std::string(visitor.possessive) + " bag.");
        }
    }

    corpus_rng rng_;
    std::string text_;
    int sentences_ = 0;
};

}  // namespace detail

// Returns exactly `bytes` characters of generated text (ASCII only: letters, digits,
// spaces, newlines and . , : ? " + =). The same (bytes, seed) gives the same text
// everywhere; a different seed gives a different text.
LOOM_INLINE std::string make_corpus(std::size_t bytes = 200'000, std::uint64_t seed = 1);

}  // namespace loom::train

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::train::detail {

LOOM_INLINE std::string corpus_number(int n) {
    if (n >= 100) return "one hundred";
    if (n < 20) return std::string(corpus_small_numbers[static_cast<std::size_t>(n)]);
    std::string words(corpus_tens[static_cast<std::size_t>(n / 10)]);
    if (n % 10 != 0) {
        words += '-';
        words += corpus_small_numbers[static_cast<std::size_t>(n % 10)];
    }
    return words;
}

LOOM_INLINE std::string corpus_plural(std::string_view noun) {
    std::string word(noun);
    const auto ends_with = [&](std::string_view tail) { return noun.ends_with(tail); };
    if (ends_with("s") || ends_with("x") || ends_with("ch") || ends_with("sh")) return word + "es";
    if (ends_with("y") && noun.size() > 1 && std::string_view("aeiou").find(noun[noun.size() - 2]) == std::string_view::npos) {
        word.pop_back();
        return word + "ies";
    }
    return word + "s";
}

LOOM_INLINE std::string corpus_capitalized(std::string text) {
    for (char& c : text) {
        if (c >= 'a' && c <= 'z') {
            c = static_cast<char>(c - 'a' + 'A');
            break;
        }
        if (c >= 'A' && c <= 'Z') break;
    }
    return text;
}
}  // namespace loom::train::detail

namespace loom::train {

LOOM_INLINE std::string make_corpus(std::size_t bytes, std::uint64_t seed) {
    detail::corpus_writer writer(seed);
    std::string text;
    text.reserve(bytes + 1024);
    while (text.size() < bytes) writer.paragraph(text);
    text.resize(bytes);
    return text;
}

}  // namespace loom::train
#endif  // LOOM_HEADER_DEFINITIONS
