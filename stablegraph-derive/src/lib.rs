//! `#[derive(Tree)]` for stablegraph's parameter trees (`stablegraph::tree::Tree`).
//!
//! The type must have exactly one type parameter, the leaf type, without bounds:
//!
//! ```ignore
//! #[derive(Tree)]
//! struct Mlp<T> {
//!     fc1: Linear<T>,          // a nested tree: its leaves under `fc1.`
//!     fc2: Linear<T>,
//!     scale: Option<T>,        // a leaf when present: `scale`
//!     #[tree(rename = "mixer.D")]
//!     d: T,                    // the leaf `mixer.D`
//!     #[tree(skip)]
//!     eps: f64,                // not a leaf: copied into every mapped tree
//! }
//! ```
//!
//! A field whose type is the parameter is a leaf; `Option<…>` and `Vec<…>` of anything are
//! walked here (a `Vec`'s items are named by their index); any other field type must itself be
//! a `Tree` of the same leaf. Fields are walked in declaration order. Tuple fields are named by
//! their index, except a single one (a newtype), which adds no name; `#[tree(rename = "")]`
//! adds none either. Enums are walked through the variant they hold.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::{
    parse_macro_input, Data, DeriveInput, Error, Fields, GenericArgument, GenericParam, Ident,
    PathArguments, Type,
};

/// Implements `stablegraph::tree::Tree<T>` for a struct or enum generic over its leaf type `T`,
/// and `stablegraph::ops::Carry` for its tensor form (a loop state of its leaves, in order).
/// Attributes on fields: `#[tree(rename = "path.name")]`, `#[tree(skip)]` (not a leaf; the
/// field must be `Clone`).
#[proc_macro_derive(Tree, attributes(tree))]
pub fn derive_tree(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// The four walks of a tree, each generated from the same field list.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// `visit_at`: every leaf by reference, nothing built.
    Visit,
    /// `try_map_at`: a tree of `U` from references.
    MapRef,
    /// `try_into_map_at`: a tree of `U` from the leaves by value.
    MapOwned,
    /// `try_replace_at`: a tree of the same type from references.
    Replace,
}

impl Mode {
    /// The trait method that walks a nested tree in this mode.
    fn method(self) -> Ident {
        let name = match self {
            Mode::Visit => "visit_at",
            Mode::MapRef => "try_map_at",
            Mode::MapOwned => "try_into_map_at",
            Mode::Replace => "try_replace_at",
        };
        Ident::new(name, Span::call_site())
    }
}

/// One field: how it is bound in a pattern, its name in paths, and its type.
struct Field {
    /// The pattern binding (`__f0`, ...).
    binding: Ident,
    /// The field's member in patterns and constructors (`name` or `0`).
    member: syn::Member,
    /// Its path segment ("" for none).
    segment: String,
    /// Not a leaf: cloned or moved as it is.
    skip: bool,
    ty: Type,
}

fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let name = &input.ident;
    let leaf = leaf_param(input)?;
    let variants: Vec<(Tokens, Vec<Field>, FieldsKind)> = match &input.data {
        Data::Struct(s) => vec![(quote!(#name), fields(&s.fields)?, kind(&s.fields))],
        Data::Enum(e) => e
            .variants
            .iter()
            .map(|v| {
                let vn = &v.ident;
                Ok((quote!(#name::#vn), fields(&v.fields)?, kind(&v.fields)))
            })
            .collect::<syn::Result<_>>()?,
        Data::Union(u) => {
            return Err(Error::new(
                u.union_token.span(),
                "Tree cannot be derived for a union",
            ))
        }
    };
    let arms = |mode: Mode| -> Tokens {
        let arms = variants.iter().map(|(path, fields, kind)| {
            let pattern = construct(path, fields, *kind, |f| {
                let b = &f.binding;
                quote!(#b)
            });
            let body = if mode == Mode::Visit {
                let steps = fields.iter().filter(|f| !f.skip).map(|f| {
                    let b = &f.binding;
                    walk_field(f, &leaf, mode, quote!(#b))
                });
                quote!({ #(#steps;)* })
            } else {
                let built = construct(path, fields, *kind, |f| {
                    let b = &f.binding;
                    if f.skip {
                        if mode == Mode::MapOwned {
                            quote!(#b)
                        } else {
                            quote!(::core::clone::Clone::clone(#b))
                        }
                    } else {
                        walk_field(f, &leaf, mode, quote!(#b))
                    }
                });
                quote!(::core::result::Result::Ok(#built))
            };
            quote!(#pattern => #body)
        });
        quote!(match self { #(#arms,)* })
    };
    let (visit, map_ref, map_owned, replace) = (
        arms(Mode::Visit),
        arms(Mode::MapRef),
        arms(Mode::MapOwned),
        arms(Mode::Replace),
    );
    let tree = quote!(::stablegraph::tree::Tree);
    let result = quote!(::stablegraph::Result);
    Ok(quote! {
        #[automatically_derived]
        #[allow(unused_variables, clippy::needless_borrow)]
        impl<#leaf> #tree<#leaf> for #name<#leaf> {
            type Map<__U> = #name<__U>;

            fn visit_at<'__a>(
                &'__a self,
                path: &mut ::std::string::String,
                f: &mut dyn ::core::ops::FnMut(&str, &'__a #leaf),
            ) {
                #visit
            }

            fn try_map_at<'__a, __U>(
                &'__a self,
                path: &mut ::std::string::String,
                f: &mut dyn ::core::ops::FnMut(&str, &'__a #leaf) -> #result<__U>,
            ) -> #result<#name<__U>> {
                #map_ref
            }

            fn try_into_map_at<__U>(
                self,
                path: &mut ::std::string::String,
                f: &mut dyn ::core::ops::FnMut(&str, #leaf) -> #result<__U>,
            ) -> #result<#name<__U>> {
                #map_owned
            }

            fn try_replace_at(
                &self,
                path: &mut ::std::string::String,
                f: &mut dyn ::core::ops::FnMut(&str, &#leaf) -> #result<#leaf>,
            ) -> #result<Self> {
                #replace
            }
        }

        #[automatically_derived]
        impl ::stablegraph::ops::Carry for #name<::stablegraph::ops::Tensor> {
            fn flatten(&self, out: &mut ::std::vec::Vec<::stablegraph::ops::Tensor>) {
                ::stablegraph::tree::carry_flatten(self, out)
            }

            fn unflatten(
                template: &Self,
                values: &mut dyn ::core::iter::Iterator<Item = ::stablegraph::ops::Tensor>,
            ) -> ::core::option::Option<Self> {
                ::stablegraph::tree::carry_unflatten(template, values)
            }
        }

        #[automatically_derived]
        impl ::stablegraph::transforms::Args for #name<::stablegraph::ops::Tensor> {
            type First = Self;
            const FIRST: &'static str = "";

            fn first(&self) -> &Self {
                self
            }
        }
    })
}

/// The type's one type parameter, which must have no bounds.
fn leaf_param(input: &DeriveInput) -> syn::Result<Ident> {
    let mut types = Vec::new();
    for p in &input.generics.params {
        match p {
            GenericParam::Type(t) => types.push(t),
            other => {
                return Err(Error::new(
                    other.span(),
                    "Tree: the type may have no lifetime or const parameters, only its leaf type",
                ))
            }
        }
    }
    let [t] = types.as_slice() else {
        return Err(Error::new(
            input.ident.span(),
            "Tree: the type needs exactly one type parameter, its leaf type (e.g. `struct Linear<T> { weight: T, bias: Option<T> }`)",
        ));
    };
    if !t.bounds.is_empty() || input.generics.where_clause.is_some() {
        return Err(Error::new(
            t.span(),
            "Tree: the leaf type parameter may not have bounds (the tree is mapped to any leaf type)",
        ));
    }
    Ok(t.ident.clone())
}

/// Named, unnamed or no fields.
#[derive(Clone, Copy)]
enum FieldsKind {
    Named,
    Unnamed,
    Unit,
}

fn kind(fields: &Fields) -> FieldsKind {
    match fields {
        Fields::Named(_) => FieldsKind::Named,
        Fields::Unnamed(_) => FieldsKind::Unnamed,
        Fields::Unit => FieldsKind::Unit,
    }
}

/// The fields with their bindings, path segments and attributes.
fn fields(fields: &Fields) -> syn::Result<Vec<Field>> {
    let newtype = matches!(fields, Fields::Unnamed(u) if u.unnamed.len() == 1);
    fields
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let (member, mut segment) = match &f.ident {
                Some(id) => (syn::Member::Named(id.clone()), id.to_string()),
                None => (
                    syn::Member::Unnamed(syn::Index::from(i)),
                    if newtype {
                        String::new()
                    } else {
                        i.to_string()
                    },
                ),
            };
            let mut skip = false;
            for attr in f.attrs.iter().filter(|a| a.path().is_ident("tree")) {
                attr.parse_nested_meta(|meta| {
                    if meta.path.is_ident("skip") {
                        skip = true;
                        Ok(())
                    } else if meta.path.is_ident("rename") {
                        let s: syn::LitStr = meta.value()?.parse()?;
                        segment = s.value();
                        Ok(())
                    } else {
                        Err(meta.error("Tree: expected `skip` or `rename = \"...\"`"))
                    }
                })?;
            }
            Ok(Field {
                binding: format_ident!("__f{}", i),
                member,
                segment,
                skip,
                ty: f.ty.clone(),
            })
        })
        .collect()
}

/// `path { member: value, ... }`, `path(value, ...)` or `path`, with a value per field.
fn construct(
    path: &Tokens,
    fields: &[Field],
    kind: FieldsKind,
    value: impl Fn(&Field) -> Tokens,
) -> Tokens {
    let values = fields.iter().map(|f| {
        let v = value(f);
        let m = &f.member;
        match kind {
            FieldsKind::Named => quote!(#m: #v),
            _ => v,
        }
    });
    match kind {
        FieldsKind::Named => quote!(#path { #(#values),* }),
        FieldsKind::Unnamed => quote!(#path ( #(#values),* )),
        FieldsKind::Unit => quote!(#path),
    }
}

/// A field walked under its own path segment.
fn walk_field(field: &Field, leaf: &Ident, mode: Mode, expr: Tokens) -> Tokens {
    let segment = &field.segment;
    let inner = walk(&field.ty, leaf, mode, expr);
    quote!({
        let __n = ::stablegraph::tree::enter(path, #segment);
        let __v = #inner;
        path.truncate(__n);
        __v
    })
}

/// The walk of a value of type `ty` held in `expr` (a reference, or the value itself in
/// `MapOwned`): a leaf, an `Option` or `Vec` walked here, or a nested tree.
fn walk(ty: &Type, leaf: &Ident, mode: Mode, expr: Tokens) -> Tokens {
    if is_leaf(ty, leaf) {
        return match mode {
            Mode::Visit => quote!(f(path.as_str(), #expr)),
            _ => quote!(f(path.as_str(), #expr)?),
        };
    }
    if let Some(inner) = wrapped(ty, "Option") {
        let item = walk(inner, leaf, mode, quote!(__x));
        return match mode {
            Mode::Visit => quote!(if let ::core::option::Option::Some(__x) = #expr { #item; }),
            _ => quote!(match #expr {
                ::core::option::Option::Some(__x) => ::core::option::Option::Some(#item),
                ::core::option::Option::None => ::core::option::Option::None,
            }),
        };
    }
    if let Some(inner) = wrapped(ty, "Vec") {
        let item = walk(inner, leaf, mode, quote!(__x));
        let iter = if mode == Mode::MapOwned {
            quote!(::core::iter::IntoIterator::into_iter(#expr))
        } else {
            quote!((#expr).iter())
        };
        let step = quote! {
            let __n = ::stablegraph::tree::enter(path, &__i.to_string());
            let __v = #item;
            path.truncate(__n);
        };
        return match mode {
            Mode::Visit => quote!(for (__i, __x) in #iter.enumerate() { #step }),
            _ => quote!({
                let mut __out = ::std::vec::Vec::new();
                for (__i, __x) in #iter.enumerate() {
                    #step
                    __out.push(__v);
                }
                __out
            }),
        };
    }
    let method = mode.method();
    let call = quote!(::stablegraph::tree::Tree::<#leaf>::#method(#expr, path, f));
    match mode {
        Mode::Visit => call,
        _ => quote!(#call?),
    }
}

/// Whether `ty` is the leaf parameter itself.
fn is_leaf(ty: &Type, leaf: &Ident) -> bool {
    matches!(ty, Type::Path(p) if p.qself.is_none() && p.path.is_ident(leaf))
}

/// The argument of `ty` when it is `name<arg>` (by its last path segment).
fn wrapped<'t>(ty: &'t Type, name: &str) -> Option<&'t Type> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.first()? {
        GenericArgument::Type(t) if args.args.len() == 1 => Some(t),
        _ => None,
    }
}
